import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { AppError } from '../core/errors.ts';
import type { Logger } from '../log.ts';
import { latestWitnessed, writeWitness } from './anchors/witness.ts';
import { ChainHeadFromDb, type ChainHead } from './chain.ts';
import type { Checkpoint, SigningGuard } from './checkpoints.ts';
import type { AuditLog } from './log.ts';
import { ChainVerifier, rowMacFault, type RowMacCheck, type RowMacFault } from './verify.ts';
import { recordedValue } from '../db/settings.ts';
import type { Connection, Transaction } from '../db/knex.ts';
import { events } from './store/index.ts';

/**
 * The last head this process signed, kept outside the database: `<data dir>/audit-signed-head.json`, and
 * the newest checkpoint of the witness directory when one is configured. Before anything is signed the
 * chain must still hold that hash at that seq and link from it to the head being signed; a chain that
 * does not was rewritten or cut behind the server's back, and is never signed (docs/audit.md, "Anchors and
 * the signed head").
 */

export const SIGNED_HEAD_FILE = 'audit-signed-head.json';

const SignedHead = z.object({
  origin: z.string(),
  seq: z.number().int().positive(),
  head_hash: z.string(),
  ts: z.string(),
  /**
   * Heads an operator gave up when accepting a restored database (acceptRestore): a witness entry that
   * names one of them is no longer held against the chain. Kept through every later signature.
   */
  given_up: z.array(z.object({ seq: z.number(), head_hash: z.string() })).optional(),
});
type SignedHead = z.infer<typeof SignedHead>;

/** Why a chain contradicts a signed head. */
export type TamperReason =
  'rows_deleted' | 'head_mismatch' | 'chain_broken' | 'signed_head_invalid' | 'origin_mismatch' | RowMacFault;

export interface TamperState {
  reason: TamperReason;
  /** The seq of the signed head the chain contradicts (or of the first row that breaks the link). */
  seq: number;
  detail: string;
  /** When this process first found it. */
  since: string;
}

export interface SignedHeadGuard extends SigningGuard {
  tampered(): TamperState | undefined;
}

/** Written aside and renamed into place: a reader never sees half a file. */
function writeAtomically(file: string, text: string): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const aside = `${file}.${process.pid}.tmp`;
  const fd = fs.openSync(aside, 'w', 0o600);
  try {
    fs.writeSync(fd, text);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(aside, file);
}

/** The head in the file; null when the file is there but holds no head. */
function readSignedHead(file: string): SignedHead | undefined | null {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  try {
    return SignedHead.parse(JSON.parse(text));
  } catch {
    return null;
  }
}

/** Verifies that the rows after a signed head extend it up to `head`; refuses at the first that does not. */
async function linkFrom(
  trx: Transaction,
  from: SignedHead,
  head: ChainHead,
  refuse: (reason: TamperReason, seq: number, detail: string) => never,
  rowMacs?: RowMacCheck,
): Promise<void> {
  const verifier = new ChainVerifier({ seq: from.seq, hash: from.head_hash }, undefined, rowMacs);
  for (let after = from.seq; after < head.seq;) {
    const page = await events.rowsUpTo(trx, after, head.seq, 5000);
    for (const raw of page)
      if (!verifier.pushStored(raw)) {
        const bad = verifier.report.first_bad!;
        if (bad.fault === 'row_unsigned' || bad.fault === 'row_mac_mismatch')
          refuse(bad.fault, bad.seq, bad.detail);
        refuse(
          'chain_broken',
          bad.seq,
          `row ${bad.seq} does not extend the head signed at seq ${from.seq} (${bad.fault})`,
        );
      }
    if (page.length === 0) break;
    after = verifier.report.head_seq;
  }
}

/**
 * Before the first signature this process or a witness knows of: the row MACs of every row from the
 * pinned seq up to `head` (the rows since a signed head are checked as linkFrom walks them).
 */
async function macsUpTo(
  trx: Transaction,
  check: RowMacCheck,
  head: ChainHead,
  refuse: (reason: TamperReason, seq: number, detail: string) => never,
): Promise<void> {
  for (let after = check.from - 1; after < head.seq;) {
    const page = await events.macsUpTo(trx, after, head.seq, 5000);
    for (const raw of page) {
      const row = { seq: Number(raw.seq), hash: raw.hash };
      const bad = rowMacFault(check, row, raw.row_mac);
      if (bad) refuse(bad.fault, row.seq, bad.detail);
      after = row.seq;
    }
    if (page.length === 0) break;
  }
}

/** Refuses unless the chain up to `head` still holds each of the heads signed before, at its seq. */
async function holdsSignedHeads(
  trx: Transaction,
  head: ChainHead,
  known: readonly SignedHead[],
  refuse: (reason: TamperReason, seq: number, detail: string) => never,
): Promise<void> {
  for (const signed of known) {
    if (signed.seq > head.seq)
      refuse(
        'rows_deleted',
        signed.seq,
        `the log ends at seq ${head.seq}, before the head signed at seq ${signed.seq}`,
      );
    const row = ChainHeadFromDb.optional().parse(await events.hashAt(trx, signed.seq));
    if (row?.hash !== signed.head_hash)
      refuse('head_mismatch', signed.seq, `row ${signed.seq} is not the head signed at that seq`);
  }
}

/**
 * Refuses unless the chain up to `head` still holds the newest row this process appended (and answered
 * an agent with): a contradiction its appends already met, or that row gone or replaced.
 */
async function holdsAppended(
  trx: Transaction,
  head: ChainHead,
  mine: ReturnType<AuditLog['appended']> | undefined,
  refuse: (reason: TamperReason, seq: number, detail: string) => never,
): Promise<void> {
  const found = mine?.contradiction;
  if (found) refuse(found.reason, found.seq, found.detail);
  const own = mine?.committed;
  if (!own) return;
  const asSigned = { origin: '', seq: own.seq, head_hash: own.hash, ts: '' };
  await holdsSignedHeads(trx, head, [asSigned], refuse);
}

/** Why a database naming the log `named` is not the log the host pins; undefined when it is. */
const otherOrigin = (named: string | undefined, pinned: string) =>
  named === undefined || named === pinned
    ? undefined
    : `the database names the log ${named}, the host roots pin ${pinned}: the stored origin was changed`;

/** What a signed head guard checks against, besides the chain. */
export interface GuardOptions {
  dataDir: string;
  /** The origin pinned on the host (host roots): the only one this log is. */
  origin: string;
  /** The origin the database named at start, when it is not the pinned one. */
  databaseOrigin?: string;
  /** What this process appended and any contradiction its appends found (AuditLog.appended). */
  appended?: AuditLog['appended'];
  /** The host's row MACs: rows the server did not append are never signed over. */
  rowMacs?: RowMacCheck;
  witnessDir?: string;
  log?: Logger;
}

export function createSignedHeadGuard(opts: GuardOptions): SignedHeadGuard {
  const file = path.join(opts.dataDir, SIGNED_HEAD_FILE);
  let state: TamperState | undefined;
  /** A refusal whose audit row is not yet written. */
  let unrecorded: TamperState | undefined;
  const recorded = new Set<string>();
  /** The witness directory's newest head, read once (it can be large), then kept as this process signs. */
  let witnessed: SignedHead | undefined | null = null;

  const witnessHead = () => {
    if (!opts.witnessDir) return undefined;
    if (witnessed === null) witnessed = latestWitnessed(opts.witnessDir, opts.origin);
    return witnessed;
  };

  function note(reason: TamperReason, seq: number, detail: string): void {
    const found: TamperState = { reason, seq, detail, since: new Date().toISOString() };
    const key = `${reason}:${seq}`;
    if (!recorded.has(key)) {
      recorded.add(key);
      unrecorded = found;
      opts.log?.error({ reason, seq, detail }, 'audit chain contradicts the last signed head: not signing');
    }
    state ??= found;
  }

  function refuse(reason: TamperReason, seq: number, detail: string): never {
    note(reason, seq, detail);
    throw new AppError('TAMPERED', `not signing: ${detail}`, reason, { details: { seq } });
  }

  /** A contradiction this process's appends met (rows it answered with gone), noted as soon as known. */
  const noteAppended = () => {
    const found = state ? undefined : opts.appended?.().contradiction;
    if (found) note(found.reason, found.seq, found.detail);
  };

  // A database that names another origin than the host's was changed behind the server's back: its
  // chain is never signed, and no anchor is set aside as "another log's" because of it. Known from the
  // start (health reports it); the refusal itself comes with the first signature.
  const otherLog = otherOrigin(opts.databaseOrigin, opts.origin);
  if (otherLog) note('origin_mismatch', 0, otherLog);

  return {
    tampered: () => {
      noteAppended();
      return state;
    },

    async check(trx, head) {
      const renamed = otherOrigin(await recordedValue(trx, 'audit_origin'), opts.origin);
      if (renamed) refuse('origin_mismatch', 0, renamed);
      const own = readSignedHead(file);
      // A file that is not a head is not ignored: editing it must not disarm the check.
      if (own === null)
        refuse('signed_head_invalid', 0, `${file} holds no signed head: move it aside to sign again`);
      const givenUp = (h: SignedHead) =>
        own?.given_up?.some((g) => g.seq === h.seq && g.head_hash === h.head_hash) ?? false;
      const known = [own, witnessHead()]
        .filter((h): h is SignedHead => h !== undefined && h.origin === opts.origin && !givenUp(h))
        .sort((a, b) => a.seq - b.seq);
      await holdsSignedHeads(trx, head, known, refuse);
      // A process that has signed before (or a witness that has) only checks the rows since.
      if (known[0]) await linkFrom(trx, known[0], head, refuse, opts.rowMacs);
      else if (opts.rowMacs) await macsUpTo(trx, opts.rowMacs, head, refuse);
      await holdsAppended(trx, head, opts.appended?.(), refuse);
    },

    signed(cp: Checkpoint) {
      const givenUp = readSignedHead(file)?.given_up;
      const head: SignedHead = { origin: cp.origin, seq: cp.seq, head_hash: cp.head_hash, ts: cp.ts };
      writeAtomically(file, `${JSON.stringify(givenUp ? { ...head, given_up: givenUp } : head, null, 2)}\n`);
      if (opts.witnessDir) {
        writeWitness(opts.witnessDir, { checkpoint: cp });
        witnessed = head;
      }
    },

    async record(audit: AuditLog) {
      const found = unrecorded;
      if (!found) return;
      try {
        await audit.append({
          kind: 'audit.tampered',
          result: 'error',
          error_code: 'TAMPERED',
          details: { reason: found.reason, seq: found.seq, detail: found.detail, found_at: found.since },
        });
        if (unrecorded === found) unrecorded = undefined;
      } catch (err) {
        opts.log?.warn({ err }, 'the audit row of a refused signature could not be written yet');
      }
    },
  };
}

/** What acceptRestore gave up and where the chain now starts being checked from. */
export interface RestoreAccepted {
  given_up: { source: 'signed_head' | 'witness'; seq: number; head_hash: string }[];
  restored_head: ChainHead | null;
  seq: number;
}

/**
 * An operator's acceptance of a database restored from a backup (docs/operations.md, "Restoring the
 * database"): the heads signed after the backup (the signed head file's, the witness directory's) that
 * the restored chain no longer holds are given up, in an audited row saying which, and the signed head
 * file is re-pinned at that row, so the next signature checks the chain from there. Refused when the
 * chain holds every head signed (nothing to accept).
 */
export async function acceptRestore(
  deps: { knex: Connection; audit: AuditLog; dataDir: string; origin: string; witnessDir?: string },
  reason: string,
  actor: string,
): Promise<RestoreAccepted> {
  const file = path.join(deps.dataDir, SIGNED_HEAD_FILE);
  const own = readSignedHead(file);
  const head = ChainHeadFromDb.optional().parse(await events.headRow(deps.knex));
  const heads: [RestoreAccepted['given_up'][number]['source'], SignedHead | undefined | null][] = [
    ['signed_head', own],
    ['witness', deps.witnessDir ? latestWitnessed(deps.witnessDir, deps.origin) : undefined],
  ];
  const givenUp: RestoreAccepted['given_up'] = [];
  for (const [source, h] of heads) {
    if (!h || h.origin !== deps.origin) continue;
    if (own?.given_up?.some((g) => g.seq === h.seq && g.head_hash === h.head_hash)) continue;
    const row = ChainHeadFromDb.optional().parse(await events.hashAt(deps.knex, h.seq));
    if (row?.hash !== h.head_hash) givenUp.push({ source, seq: h.seq, head_hash: h.head_hash });
  }
  if (givenUp.length === 0)
    throw new AppError(
      'CONFLICT',
      'audit accept-restore: the chain holds every head signed; there is no restore to accept',
      'no_restore',
    );
  const row = await deps.audit.append({
    kind: 'audit.restore_accepted',
    actor,
    result: 'ok',
    details: { reason, given_up: givenUp, restored_head: head ?? null },
  });
  const kept = [...(own?.given_up ?? []), ...givenUp.map(({ seq, head_hash }) => ({ seq, head_hash }))];
  const pinned: SignedHead = {
    origin: deps.origin,
    seq: row.seq,
    head_hash: row.hash,
    ts: row.ts,
    given_up: kept,
  };
  writeAtomically(file, `${JSON.stringify(pinned, null, 2)}\n`);
  return { given_up: givenUp, restored_head: head ?? null, seq: row.seq };
}
