import { z } from 'zod';
import { keyIdOf, verifySignature } from './signing.ts';

/**
 * What a `checkpoint` row records in `details`: the signed statement `{origin, seq, head_hash, ts}`
 * (as `checkpoint_seq` for its seq), the signing key's id and the signature. Rows written before the
 * statement and signature were recorded carry `checkpoint_seq`, `head_hash` and `key_id` alone.
 */
export const CheckpointRowDetails = z.object({
  checkpoint_seq: z.number().int().positive(),
  head_hash: z.string(),
  key_id: z.string(),
  origin: z.string().optional(),
  ts: z.string().optional(),
  signature: z.string().optional(),
});
export type CheckpointRowDetails = z.infer<typeof CheckpointRowDetails>;

/**
 * The keys a log's checkpoints may be signed with (by key id: one, or several when the key was
 * rotated), and the log's origin when known.
 */
export interface CheckpointTrust {
  keys: ReadonlyMap<string, string>;
  origin?: string;
}

export const trustOf = (publicKeyPems: string | readonly string[], origin?: string): CheckpointTrust => ({
  keys: new Map([publicKeyPems].flat().map((pem) => [keyIdOf(pem), pem])),
  ...(origin !== undefined ? { origin } : {}),
});

/** The trusted key ids, for messages. */
export const trustedIds = (trust: CheckpointTrust) => [...trust.keys.keys()].join(', ');

/** Why a checkpoint row fails, as a short code (for tests and tools) and a sentence naming the seq. */
export type CheckpointRowFault =
  'malformed' | 'contradicts_chain' | 'foreign_key' | 'foreign_origin' | 'bad_signature';

export interface CheckpointRowCheck {
  /** Set when the row contradicts the chain or its key: verification fails. */
  fault?: { code: CheckpointRowFault; detail: string };
  /** True when the row carries a signature that holds: the rows up to it are anchored. */
  signed: boolean;
}

/**
 * Checks a `checkpoint` row against the chain it sits in. countersign appends the row in the
 * transaction that signs the checkpoint, under the chain's lock, so it always follows the row it
 * names: `checkpoint_seq` is its own seq − 1 and `head_hash` is its own `prev_hash`, which its own
 * hash covers. A rewrite of any earlier row re-hashes that link, and the recorded (signed) head no
 * longer matches; a signature by another key than the log's is refused as well. Needs the row alone,
 * so it holds in a filtered export too.
 */
export function checkCheckpointRow(
  row: { seq: number; prev_hash: string; details: unknown },
  trust: CheckpointTrust,
): CheckpointRowCheck {
  const parsed = CheckpointRowDetails.safeParse(row.details);
  const at = `checkpoint row ${row.seq}`;
  if (!parsed.success) {
    return { signed: false, fault: { code: 'malformed', detail: `${at} does not record a checkpoint` } };
  }
  const d = parsed.data;
  if (d.checkpoint_seq !== row.seq - 1 || d.head_hash !== row.prev_hash) {
    return {
      signed: false,
      fault: {
        code: 'contradicts_chain',
        detail: `${at}: the checkpoint at seq ${d.checkpoint_seq} does not match the chain (the rows up to seq ${d.checkpoint_seq} were changed)`,
      },
    };
  }
  const key = trust.keys.get(d.key_id);
  if (key === undefined) {
    return {
      signed: false,
      fault: {
        code: 'foreign_key',
        detail: `${at}: the checkpoint at seq ${d.checkpoint_seq} names key ${d.key_id}, not the log's key ${trustedIds(trust)}`,
      },
    };
  }
  if (d.signature === undefined || d.origin === undefined || d.ts === undefined) return { signed: false };
  if (trust.origin !== undefined && d.origin !== trust.origin) {
    return {
      signed: false,
      fault: {
        code: 'foreign_origin',
        detail: `${at}: the checkpoint at seq ${d.checkpoint_seq} is of another log (${d.origin})`,
      },
    };
  }
  const statement = { origin: d.origin, seq: d.checkpoint_seq, head_hash: d.head_hash, ts: d.ts };
  if (!verifySignature(key, statement, d.signature)) {
    return {
      signed: false,
      fault: {
        code: 'bad_signature',
        detail: `${at}: the checkpoint at seq ${d.checkpoint_seq} is not signed by the log's key ${d.key_id}`,
      },
    };
  }
  return { signed: true };
}

/**
 * Follows the checkpoint rows of one walk in seq order: the first fault, how many rows were checked,
 * and how far the chain is anchored. Once a signed row has been seen, an unsigned one after it is a
 * fault: only rows written before checkpoint rows carried their signature may lack one, and stripping
 * the signature must not turn a contradicting row into an unchecked one.
 */
export class CheckpointRows {
  count = 0;
  /** The seq of the last signed checkpoint row (0 before any). */
  anchoredThrough = 0;
  first_bad?: { seq: number; code: CheckpointRowFault; detail: string };

  constructor(private readonly trust: CheckpointTrust) {}

  /** Returns false once a fault has been found. */
  push(row: { seq: number; prev_hash: string; details: unknown }): boolean {
    if (this.first_bad) return false;
    this.count++;
    const check = checkCheckpointRow(row, this.trust);
    const fault =
      check.fault ??
      (!check.signed && this.anchoredThrough > 0
        ? {
            code: 'bad_signature' as const,
            detail: `checkpoint row ${row.seq} carries no signature, after signed ones`,
          }
        : undefined);
    if (fault) {
      this.first_bad = { seq: row.seq, ...fault };
      return false;
    }
    if (check.signed) this.anchoredThrough = row.seq;
    return true;
  }
}

/** The rows no signed checkpoint covers yet: `from`–`to` (seqs), empty when `from > to`. */
export interface UnanchoredTail {
  from: number;
  to: number;
}

/**
 * The tail after the last anchor. `anchoredThrough` is the last seq a signed checkpoint covers, or the
 * seq of the checkpoint row that records it (that row carries the signature, so it cannot be signed
 * itself; deleting it alone hides nothing but the record of the signing).
 */
export function unanchoredTail(anchoredThrough: number, head: number): UnanchoredTail | undefined {
  return head > anchoredThrough ? { from: anchoredThrough + 1, to: head } : undefined;
}

export const describeTail = (t: UnanchoredTail) =>
  t.from === t.to
    ? `row ${t.from} follows the last checkpoint`
    : `rows ${t.from}–${t.to} follow the last checkpoint`;
