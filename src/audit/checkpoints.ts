import type { Knex } from 'knex';
import { rowFromDb } from './chain.ts';
import { AUDIT_LOCK_KEY, type AuditLog } from './log.ts';
import { verifySignature, type Signer } from './signing.ts';
import { ChainVerifier } from './verify.ts';

export interface Checkpoint {
  origin: string;
  seq: number;
  head_hash: string;
  ts: string;
  key_id: string;
  public_key: string;
  signature: string;
}

/** The signed statement: exactly these four fields, as RFC 8785 canonical JSON. */
export const checkpointPayload = (c: Pick<Checkpoint, 'origin' | 'seq' | 'head_hash' | 'ts'>) => ({
  origin: c.origin,
  seq: c.seq,
  head_hash: c.head_hash,
  ts: c.ts,
});

export const checkpointSignatureValid = (c: Checkpoint, publicKey = c.public_key) =>
  verifySignature(publicKey, checkpointPayload(c), c.signature);

export class ChainBrokenError extends Error {
  override name = 'ChainBrokenError';
}

const fromDb = (r: Record<string, unknown>): Checkpoint => ({
  origin: String(r.origin),
  seq: Number(r.seq),
  head_hash: String(r.head_hash),
  ts: String(r.ts),
  key_id: String(r.key_id),
  public_key: String(r.public_key),
  signature: String(r.signature),
});

export async function latestCheckpoint(knex: Knex | Knex.Transaction): Promise<Checkpoint | undefined> {
  const row = (await knex('audit_checkpoints').orderBy('id', 'desc').first()) as
    Record<string, unknown> | undefined;
  return row ? fromDb(row) : undefined;
}

export async function listCheckpoints(knex: Knex): Promise<Checkpoint[]> {
  return ((await knex('audit_checkpoints').orderBy('id')) as Record<string, unknown>[]).map(fromDb);
}

export interface CheckpointDeps {
  knex: Knex;
  audit: AuditLog;
  signer: Signer;
  origin: string;
}

/**
 * Signs the current head. Under the chain's advisory lock, the rows since the previous checkpoint are
 * verified to extend it; a chain that does not is never signed (ChainBrokenError). Returns the previous
 * checkpoint when nothing was appended since.
 */
export async function createCheckpoint(deps: CheckpointDeps): Promise<Checkpoint | undefined> {
  return deps.knex.transaction(async (trx) => {
    await trx.raw('select pg_advisory_xact_lock(?)', [AUDIT_LOCK_KEY]);
    const head = (await trx('audit_events').select('seq', 'hash').orderBy('seq', 'desc').first()) as
      { seq: number | string; hash: string } | undefined;
    if (!head) return undefined;
    const prev = await latestCheckpoint(trx);
    if (prev && prev.seq === Number(head.seq)) return prev;
    if (prev && prev.seq > Number(head.seq))
      throw new ChainBrokenError(`the log is shorter than checkpoint seq ${prev.seq}`);

    const verifier = new ChainVerifier(prev ? { seq: prev.seq, hash: prev.head_hash } : undefined);
    for (let after = prev?.seq ?? 0; ;) {
      const page = (await trx('audit_events').where('seq', '>', after).orderBy('seq').limit(5000)) as Record<
        string,
        unknown
      >[];
      for (const raw of page) {
        if (!verifier.push(rowFromDb(raw))) {
          const bad = verifier.report.first_bad!;
          throw new ChainBrokenError(
            `not signing: row ${bad.seq} breaks the chain (${bad.fault}: ${bad.detail})`,
          );
        }
      }
      if (page.length < 5000) break;
      after = Number(page.at(-1)!.seq);
    }

    const statement = {
      origin: deps.origin,
      seq: Number(head.seq),
      head_hash: head.hash,
      ts: new Date().toISOString(),
    };
    const checkpoint: Checkpoint = {
      ...statement,
      key_id: deps.signer.key_id,
      public_key: deps.signer.public_key,
      signature: deps.signer.sign(checkpointPayload(statement)),
    };
    await trx('audit_checkpoints').insert(checkpoint);
    await deps.audit.appendIn(trx, {
      kind: 'checkpoint',
      result: 'ok',
      details: { checkpoint_seq: checkpoint.seq, head_hash: checkpoint.head_hash, key_id: checkpoint.key_id },
    });
    return checkpoint;
  });
}
