import { z } from 'zod';
import { ChainHeadFromDb, GENESIS_HASH, type ChainHead } from './chain.ts';
import { trustOf, type CheckpointRowDetails } from './chain-checkpoints.ts';
import type { AuditLog } from './log.ts';
import { verifySignature, type Signer } from './signing.ts';
import { ChainVerifier } from './verify.ts';
import { AppError } from '../core/errors.ts';
import type { Connection, Queryable, Transaction } from '../db/knex.ts';
import { checkpoints, events } from './store/index.ts';

/**
 * A signed statement that the chain's row `seq` has hash `head_hash`, as stored in audit_checkpoints
 * (bigint as a number, see db/knex.ts; the id column is dropped).
 */
export const Checkpoint = z.object({
  origin: z.string(),
  seq: z.number().int().positive(),
  head_hash: z.string(),
  ts: z.string(),
  key_id: z.string(),
  public_key: z.string(),
  signature: z.string(),
});
export type Checkpoint = z.infer<typeof Checkpoint>;

/** The signed statement: exactly these four fields, as RFC 8785 canonical JSON. */
export const checkpointPayload = (c: Pick<Checkpoint, 'origin' | 'seq' | 'head_hash' | 'ts'>) => ({
  origin: c.origin,
  seq: c.seq,
  head_hash: c.head_hash,
  ts: c.ts,
});

export const checkpointSignatureValid = (c: Checkpoint, publicKey = c.public_key) =>
  verifySignature(publicKey, checkpointPayload(c), c.signature);

/** The chain does not extend the last signed checkpoint: never signed again, said as tampering. */
const chainBroken = (message: string) => new AppError('TAMPERED', message, 'chain_broken');

export async function latestCheckpoint(knex: Queryable): Promise<Checkpoint | undefined> {
  return Checkpoint.optional().parse(await checkpoints.latest(knex));
}

export async function listCheckpoints(knex: Queryable): Promise<Checkpoint[]> {
  return Checkpoint.array().parse(await checkpoints.list(knex));
}

/**
 * What stands between the chain and a signature besides the database: the last head signed, kept outside
 * it (src/audit/signed-head.ts). Declared here, where it is called, so that the modules that implement it
 * can build on checkpoints without a cycle.
 */
export interface SigningGuard {
  /** Under the chain's lock, before signing `head`: throws TAMPERED when the chain contradicts a signed head. */
  check(trx: Transaction, head: ChainHead): Promise<void>;
  /** Inside the signing transaction: the checkpoint is now the last head signed. */
  signed(checkpoint: Checkpoint): void;
  /** Appends the audit row of a refusal not yet recorded, once appends succeed. */
  record(audit: AuditLog): Promise<void>;
  /** Why this process refused to sign, once it has: /healthz reports it. */
  tampered(): { reason: string; seq: number; detail: string; since: string } | undefined;
}

/** Sends a committed checkpoint off the box (an RFC 3161 time-stamp: src/audit/anchors). Never throws. */
export type Anchorer = (checkpoint: Checkpoint) => Promise<void>;

export interface CheckpointDeps {
  knex: Connection;
  audit: AuditLog;
  signer: Signer;
  origin: string;
  guard?: SigningGuard;
  anchor?: Anchorer;
}

/**
 * Signs the current head. Under the chain's advisory lock, the rows since the previous checkpoint are
 * verified to extend it; a chain that does not is never signed (TAMPERED, reason chain_broken). Returns the previous
 * checkpoint when nothing was appended since. With a guard, the chain must also extend the last head signed
 * outside the database (TAMPERED otherwise, recorded as audit.tampered once appends succeed); a new
 * checkpoint is then anchored off the box, outside the chain's lock.
 */
export async function createCheckpoint(deps: CheckpointDeps): Promise<Checkpoint | undefined> {
  await deps.guard?.record(deps.audit);
  let created = false;
  const checkpoint = await signHead(deps, () => (created = true)).catch(async (err: unknown) => {
    await deps.guard?.record(deps.audit);
    throw err;
  });
  if (created && checkpoint) await deps.anchor?.(checkpoint);
  return checkpoint;
}

async function signHead(deps: CheckpointDeps, created: () => void): Promise<Checkpoint | undefined> {
  return deps.knex.transaction(async (trx) => {
    await checkpoints.lockChain(trx);
    const head = ChainHeadFromDb.optional().parse(await events.headRow(trx));
    await deps.guard?.check(trx, head ?? { seq: 0, hash: GENESIS_HASH });
    if (!head) return undefined;
    const prev = await latestCheckpoint(trx);
    if (prev && prev.seq === head.seq) return prev;
    if (prev && prev.seq > head.seq) throw chainBroken(`the log is shorter than checkpoint seq ${prev.seq}`);

    // The checkpoint rows among them must agree with the chain and be this log's own, signed by this
    // key (or, for the row that records the previous checkpoint, by that one's: the key was rotated).
    const verifier = new ChainVerifier(
      prev ? { seq: prev.seq, hash: prev.head_hash } : undefined,
      trustOf(prev ? [deps.signer.public_key, prev.public_key] : deps.signer.public_key, deps.origin),
    );
    for (let after = prev?.seq ?? 0; ;) {
      const page: unknown[] = await events.rowsAfter(trx, after, 5000);
      for (const raw of page) {
        if (!verifier.pushStored(raw)) {
          const bad = verifier.report.first_bad!;
          throw chainBroken(`not signing: row ${bad.seq} breaks the chain (${bad.fault}: ${bad.detail})`);
        }
      }
      if (page.length < 5000) break;
      after = verifier.report.head_seq;
    }

    const statement = {
      origin: deps.origin,
      seq: head.seq,
      head_hash: head.hash,
      ts: new Date().toISOString(),
    };
    const checkpoint: Checkpoint = {
      ...statement,
      key_id: deps.signer.key_id,
      public_key: deps.signer.public_key,
      signature: deps.signer.sign(checkpointPayload(statement)),
    };
    await checkpoints.insert(trx, checkpoint);
    deps.guard?.signed(checkpoint);
    created();
    // The row records the signed statement and its signature, so the chain itself carries every
    // checkpoint: a later rewrite of the rows it covers contradicts it (chain-checkpoints.ts).
    const details: CheckpointRowDetails = {
      checkpoint_seq: checkpoint.seq,
      head_hash: checkpoint.head_hash,
      key_id: checkpoint.key_id,
      origin: checkpoint.origin,
      ts: checkpoint.ts,
      signature: checkpoint.signature,
    };
    await deps.audit.appendIn(trx, { kind: 'checkpoint', result: 'ok', details });
    return checkpoint;
  });
}

/** How often checkpoints are signed while rows are written: audit.checkpoint_interval_s and _rows. */
export interface Cadence {
  interval_s: number;
  rows: number;
}

/**
 * Signs a checkpoint when one is due: `cadence.rows` rows or more written since the last one (not
 * counting the row that records it), or a row no checkpoint covers that is `cadence.interval_s` old.
 * None while idle: the row that records the last checkpoint is not a reason for another. A few small
 * reads on the leader's timer, nothing on the append path.
 */
export async function checkpointIfDue(
  deps: CheckpointDeps,
  cadence: Cadence,
  now = Date.now(),
): Promise<Checkpoint | undefined> {
  return (await checkpointTick(deps, cadence, now)).checkpoint;
}

/**
 * checkpointIfDue, and when none was signed, when the rows already written make one due by time
 * (`due_at`, ms since the epoch); no `due_at` when no row waits for a checkpoint, or one was just signed.
 */
export async function checkpointTick(
  deps: CheckpointDeps,
  cadence: Cadence,
  now = Date.now(),
): Promise<{ checkpoint?: Checkpoint; due_at?: number }> {
  const [head, prev] = await Promise.all([events.headKind(deps.knex), latestCheckpoint(deps.knex)]);
  if (!head) return {};
  const headSeq = Number(head.seq);
  // The first row the last checkpoint does not cover, past the row that records it.
  const firstSeq = prev ? prev.seq + 2 : 1;
  if (prev && (headSeq <= prev.seq || (headSeq === prev.seq + 1 && head.kind === 'checkpoint'))) {
    return {};
  }
  if (headSeq - firstSeq + 1 < cadence.rows) {
    const first = await events.firstTsFrom(deps.knex, Math.min(firstSeq, headSeq));
    if (!first) return {};
    const due_at = first.ts.getTime() + cadence.interval_s * 1000;
    if (now < due_at) return { due_at };
  }
  const checkpoint = await createCheckpoint(deps);
  return checkpoint ? { checkpoint } : {};
}
