import { createHash } from 'node:crypto';
import { once } from 'node:events';
import type { Writable } from 'node:stream';
import { stringify } from 'csv-stringify/sync';
import type { AuditRow } from './chain.ts';
import { createCheckpoint, type Checkpoint, type CheckpointDeps } from './checkpoints.ts';
import { exportLines, exportPages } from './export-pages.ts';
import { EXPORT_COLUMNS, toCsvLine } from './format.ts';
import { ExportFilter } from './export-filter.ts';
import { AppError, isAppError } from '../core/errors.ts';

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
  checkpoint: Checkpoint;
  key_id: string;
  public_key: string;
  /** Ed25519 over the canonical JSON of every other field of the manifest. */
  signature: string;
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

const WRITE_CHUNK = 32 * 1024;

async function write(out: Writable, chunk: string): Promise<void> {
  if (!out.write(chunk)) await once(out, 'drain');
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
  let count = 0;
  let first: number | null = null;
  let last: { seq: number; hash: string } | null = null;

  const rows =
    opts.format === 'jsonl'
      ? exportLines(deps.knex, filter, checkpoint.seq)
      : csvLines(exportPages(deps.knex, filter, checkpoint.seq));
  if (opts.format === 'csv') await write(opts.out, stringify([[...EXPORT_COLUMNS]]));
  for await (const page of rows) {
    let text = '';
    let hashes = '';
    for (const row of page) {
      text += row.line;
      hashes += `${row.hash}\n`;
      // Handed over in pieces well under 128 KiB: larger strings go to V8's large-object space, which
      // only a full collection frees, and an export would make one per page. The stream buffers them;
      // the page waits for it once.
      if (text.length > WRITE_CHUNK) {
        opts.out.write(text);
        text = '';
      }
    }
    digest.update(hashes);
    await write(opts.out, text);
    first ??= page[0]!.seq;
    last = { seq: page.at(-1)!.seq, hash: page.at(-1)!.hash };
    count += page.length;
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
    checkpoint,
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
