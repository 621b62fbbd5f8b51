import { createHash } from 'node:crypto';
import { once } from 'node:events';
import type { Writable } from 'node:stream';
import { stringify } from 'csv-stringify/sync';
import type { Knex } from 'knex';
import { z } from 'zod';
import { rowFromDb, type AuditRow } from './chain.ts';
import { createCheckpoint, type Checkpoint, type CheckpointDeps } from './checkpoints.ts';
import { EXPORT_COLUMNS, toCsvRecord, toJsonLine } from './format.ts';
import { AuditKind } from './kinds.ts';

export const ExportFilter = z.strictObject({
  since: z.iso.datetime({ offset: true }).optional(),
  until: z.iso.datetime({ offset: true }).optional(),
  agent_id: z.string().min(1).optional(),
  tool: z.string().min(1).optional(),
  kind: AuditKind.optional(),
  result: z.enum(['ok', 'error']).optional(),
});
export type ExportFilter = z.infer<typeof ExportFilter>;

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

export const EXPORT_PAGE = 500;

export class NothingToExportError extends Error {
  override name = 'NothingToExportError';
}

/**
 * Rows of the filter up to `maxSeq`, in seq order, a page at a time: memory stays flat at any size.
 * Each query reads a window of seq values (widened while a filter leaves pages sparse), so that the
 * primary key bounds every query whatever the planner believes about the table; the next page is
 * already being read while the caller works on this one.
 */
export async function* exportPages(knex: Knex, filter: ExportFilter, maxSeq: number) {
  const fetch = (after: number, upto: number) => {
    const q = knex('audit_events')
      .where('seq', '>', after)
      .where('seq', '<=', upto)
      .orderBy('seq')
      .limit(EXPORT_PAGE);
    if (filter.since) q.where('ts', '>=', filter.since);
    if (filter.until) q.where('ts', '<', filter.until);
    if (filter.agent_id) q.where('agent_id', filter.agent_id);
    if (filter.tool) q.where('tool', filter.tool);
    if (filter.kind) q.where('kind', filter.kind);
    if (filter.result) q.where('result', filter.result);
    const page = q.then((rows: Record<string, unknown>[]) => ({ rows: rows.map(rowFromDb), upto }));
    page.catch(() => {}); // awaited below; a page nobody waits for any more must not go unhandled
    return page;
  };
  let window = EXPORT_PAGE;
  const next = (after: number) => (after < maxSeq ? fetch(after, Math.min(maxSeq, after + window)) : null);
  for (let pending = next(0); pending;) {
    const page: { rows: AuditRow[]; upto: number } = await pending;
    // A full page may have left rows in its window (read on from its last row, in a narrower window);
    // a short one has read it all (a sparse one widens the next).
    const full = page.rows.length === EXPORT_PAGE;
    if (full) window = Math.max(EXPORT_PAGE, window / 2);
    else if (page.rows.length < EXPORT_PAGE / 2) window = Math.min(window * 2, 1 << 24);
    pending = next(full ? page.rows.at(-1)!.seq : page.upto);
    if (page.rows.length > 0) yield page.rows;
  }
}

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
  if (!checkpoint) throw new NothingToExportError('the audit log is empty: nothing to export');
  const filter = ExportFilter.parse(opts.filter);
  const digest = createHash('sha256');
  let count = 0;
  let first: number | null = null;
  let last: { seq: number; hash: string } | null = null;

  if (opts.format === 'csv') await write(opts.out, stringify([[...EXPORT_COLUMNS]]));
  for await (const page of exportPages(deps.knex, filter, checkpoint.seq)) {
    let text = '';
    for (const row of page) {
      text +=
        opts.format === 'jsonl'
          ? toJsonLine(row)
          : stringify([toCsvRecord(row)], { quoted_string: true, cast: { boolean: (v) => String(v) } });
      digest.update(`${row.hash}\n`);
    }
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
