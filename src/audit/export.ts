import { createHash } from 'node:crypto';
import { once } from 'node:events';
import type { Writable } from 'node:stream';
import { stringify } from 'csv-stringify/sync';
import type { AuditRow } from './chain.ts';
import { createCheckpoint, type Checkpoint, type CheckpointDeps } from './checkpoints.ts';
import { exportChunks, pageChunks } from './export-copy.ts';
import { exportPages } from './export-pages.ts';
import { EXPORT_COLUMNS, toCsvLine } from './format.ts';
import { ExportFilter } from './export-filter.ts';
import { AppError, isAppError } from '../core/errors.ts';
import type { Queryable } from '../db/knex.ts';
import { events } from './store/index.ts';

export { ExportFilter };

export interface Manifest {
  version: 1;
  format: 'jsonl' | 'csv';
  file: string;
  exported_at: string;
  exported_by: string;
  filter: ExportFilter;
  /** True when rows were left out by the filter: then consecutive rows need not link. */
  filtered: boolean;
  row_count: number;
  first_seq: number | null;
  last_seq: number | null;
  last_hash: string | null;
  /** SHA-256 over each exported row's `hash` followed by a newline, in order. */
  rows_sha256: string;
  /**
   * SHA-256 of the export file's bytes, as written: what a download checks the file by before serving
   * it. Absent from manifests written before it was added.
   */
  file_sha256?: string;
  checkpoint: Checkpoint;
  /**
   * The last `checkpoint` row at or before the checkpoint's head — its seq, prev_hash and details (the
   * signed statement it records) — or null when there is none. A filtered export may leave that row
   * out; with this the verifier still knows which exported rows follow the last checkpoint.
   * Absent from manifests written before it was added.
   */
  chain_checkpoint?: ChainCheckpoint | null;
  key_id: string;
  public_key: string;
  /** Ed25519 over the canonical JSON of every other field of the manifest. */
  signature: string;
}

export interface ChainCheckpoint {
  seq: number;
  prev_hash: string;
  details: Record<string, unknown>;
}

/** The last checkpoint row at or before `seq`. */
async function lastChainCheckpoint(knex: Queryable, seq: number): Promise<ChainCheckpoint | null> {
  const row = await events.lastCheckpointRow(knex, seq);
  if (!row) return null;
  // jsonb comes back parsed (pg) or as text (some PGlite paths).
  const details = (typeof row.details === 'string' ? JSON.parse(row.details) : row.details) as Record<
    string,
    unknown
  >;
  return { seq: Number(row.seq), prev_hash: row.prev_hash, details };
}

/** An empty log has nothing to export: the state of the log, not the request, is at fault. */
export const isNothingToExport = (err: unknown) => isAppError(err, 'CONFLICT', 'nothing_to_export');

async function* csvLines(pages: AsyncIterable<AuditRow[]>) {
  for await (const page of pages) {
    yield page.map((row) => ({
      seq: row.seq,
      hash: row.hash,
      line: toCsvLine(row),
    }));
  }
}

/**
 * Bytes the stream may hold before the export waits for it. More than a file stream's own 16 KiB: the
 * chunks it holds go to the file in one writev, instead of one write (and one thread-pool hop) each.
 */
const BUFFERED = 1 << 20;

async function write(out: Writable, chunk: string | Buffer, written?: () => void): Promise<void> {
  // A stream that failed (a full disk) stops the export, and with it the database's stream. `errored`
  // is set as the write fails; `destroyed` may only follow on the next tick.
  if (out.errored || out.destroyed) throw out.errored ?? new Error('the export stream was closed');
  // Waits only once the stream has asked for it (write returned false): then 'drain' will come.
  if (!out.write(chunk, () => written?.()) && out.writableLength >= BUFFERED) await once(out, 'drain');
}

/**
 * Signs a checkpoint at the current head, streams every row up to it that matches the filter, and
 * returns the signed manifest. The export itself is audited (export.created).
 */
export async function exportAudit(
  deps: CheckpointDeps,
  opts: { format: 'jsonl' | 'csv'; filter: ExportFilter; out: Writable; file: string; actor: string },
): Promise<Manifest> {
  const checkpoint = await createCheckpoint(deps);
  if (!checkpoint)
    throw new AppError('CONFLICT', 'the audit log is empty: nothing to export', 'nothing_to_export');
  const filter = ExportFilter.parse(opts.filter);
  const digest = createHash('sha256');
  const fileDigest = createHash('sha256');
  let count = 0;
  let first: number | null = null;
  let last: { seq: number; hash: string } | null = null;

  const chunks =
    opts.format === 'jsonl'
      ? exportChunks(deps.knex, filter, checkpoint.seq)
      : pageChunks(csvLines(exportPages(deps.knex, filter, checkpoint.seq)));
  if (opts.format === 'csv') {
    const header = stringify([[...EXPORT_COLUMNS]]);
    fileDigest.update(header);
    await write(opts.out, header);
  }
  for await (const chunk of chunks) {
    digest.update(chunk.hashes);
    fileDigest.update(chunk.data);
    await write(opts.out, chunk.data, chunk.done);
    first ??= chunk.first;
    last = chunk.last;
    count += chunk.rows;
  }

  const unsigned: Omit<Manifest, 'signature'> = {
    version: 1,
    format: opts.format,
    file: opts.file,
    exported_at: new Date().toISOString(),
    exported_by: opts.actor,
    filter,
    filtered: Object.keys(filter).length > 0,
    row_count: count,
    first_seq: first,
    last_seq: last?.seq ?? null,
    last_hash: last?.hash ?? null,
    rows_sha256: digest.digest('hex'),
    file_sha256: fileDigest.digest('hex'),
    checkpoint,
    chain_checkpoint: await lastChainCheckpoint(deps.knex, checkpoint.seq),
    key_id: deps.signer.key_id,
    public_key: deps.signer.public_key,
  };
  const manifest: Manifest = { ...unsigned, signature: deps.signer.sign(unsigned) };
  await deps.audit.append({
    kind: 'export.created',
    actor: opts.actor,
    result: 'ok',
    details: {
      format: opts.format,
      filter,
      row_count: count,
      first_seq: first,
      last_seq: manifest.last_seq,
      rows_sha256: manifest.rows_sha256,
      checkpoint_seq: checkpoint.seq,
    },
  });
  return manifest;
}
