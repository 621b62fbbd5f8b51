import { createHash } from 'node:crypto';
import { GENESIS_HASH } from './chain.ts';
import { checkpointSignatureValid } from './checkpoints.ts';
import type { Manifest } from './export.ts';
import { readExport, type RowFacts } from './read-export.ts';
import { keyIdOf, verifySignature } from './signing.ts';

export interface ExportReport {
  ok: boolean;
  rows: number;
  valid: number;
  signature: 'valid' | 'bad signature' | 'unknown key';
  checkpoint: 'valid' | 'bad signature' | 'does not match the rows';
  /** The first problem: the row (line and seq where known) and why. */
  first_bad?: { line: number | null; seq: number | null; reason: string };
}

/**
 * Verifies an export against its manifest, offline: the manifest's and the checkpoint's signatures,
 * each row's hash, the links between rows (for an unfiltered export), the count and the digest of all
 * row hashes (which catches deletions, insertions, reordering and truncation of a filtered export too).
 * `publicKeyPem`, when given, must be the key that signed; otherwise the manifest's key is used.
 */
export async function verifyExport(
  file: string,
  manifest: Manifest,
  publicKeyPem?: string,
): Promise<ExportReport> {
  const { signature, ...unsigned } = manifest;
  const key = publicKeyPem ?? manifest.public_key;
  const report: ExportReport = {
    ok: false,
    rows: 0,
    valid: 0,
    signature: 'valid',
    checkpoint: 'valid',
  };
  const fail = (line: number | null, seq: number | null, reason: string) => {
    report.first_bad ??= { line, seq, reason };
  };

  if (publicKeyPem && keyIdOf(publicKeyPem) !== manifest.key_id) {
    report.signature = 'unknown key';
    fail(
      null,
      null,
      `manifest signed by key ${manifest.key_id}, not by the given key ${keyIdOf(publicKeyPem)}`,
    );
  } else if (!verifySignature(key, unsigned, signature)) {
    report.signature = 'bad signature';
    fail(null, null, 'manifest signature is not valid');
  }
  if (!checkpointSignatureValid(manifest.checkpoint, key) || manifest.checkpoint.key_id !== manifest.key_id) {
    report.checkpoint = 'bad signature';
    fail(null, null, 'checkpoint signature is not valid');
  }

  const digest = createHash('sha256');
  let prev: { seq: number; hash: string } | null = null;
  for await (const items of readExport(file, manifest.format)) {
    let hashes = '';
    for (const item of items) {
      report.rows++;
      if ('error' in item) {
        fail(item.line, null, item.error);
        continue;
      }
      const row = item.facts;
      hashes += `${row.hash}\n`;
      const problem = rowProblem(row, prev, manifest.filtered);
      if (problem) fail(item.line, row.seq, problem);
      else if (!report.first_bad) report.valid++;
      prev = { seq: row.seq, hash: row.hash };
    }
    digest.update(hashes);
  }

  if (report.rows < manifest.row_count) {
    fail(
      null,
      prev ? prev.seq + 1 : manifest.first_seq,
      `truncated: ${report.rows} of ${manifest.row_count} rows present`,
    );
  } else if (report.rows > manifest.row_count) {
    fail(null, null, `extra rows: ${report.rows} present, the manifest lists ${manifest.row_count}`);
  } else if (digest.digest('hex') !== manifest.rows_sha256) {
    fail(null, null, 'rows digest mismatch: rows were added, removed or reordered');
  }
  if (
    !manifest.filtered &&
    (prev?.hash !== manifest.checkpoint.head_hash || prev?.seq !== manifest.checkpoint.seq)
  ) {
    if (report.checkpoint === 'valid') report.checkpoint = 'does not match the rows';
    fail(null, prev?.seq ?? null, 'the last row is not the signed checkpoint head');
  }
  report.ok = !report.first_bad;
  return report;
}

/** What is wrong with one row read from an export, given the row before it; undefined when nothing. */
function rowProblem(row: RowFacts, prev: { seq: number; hash: string } | null, filtered: boolean) {
  if (!row.hashValid) return 'hash mismatch: the row was changed';
  if (row.notCanonical) {
    return (
      'not the canonical form of its row: a field added, removed, renamed or re-ordered, or a value or ' +
      'white space written differently'
    );
  }
  if (prev && row.seq <= prev.seq) return `reordered: seq ${row.seq} after seq ${prev.seq}`;
  if (!filtered && row.seq !== (prev ? prev.seq + 1 : 1)) {
    return `missing row: expected seq ${prev ? prev.seq + 1 : 1}, found ${row.seq}`;
  }
  if (!filtered && row.prev_hash !== (prev?.hash ?? GENESIS_HASH)) {
    return 'prev_hash mismatch: a row before it was removed, inserted or changed';
  }
  return undefined;
}

export function describeReport(r: ExportReport): string {
  const lines = [
    `${r.valid}/${r.rows} rows valid; manifest signature ${r.signature}; checkpoint signature ${r.checkpoint}`,
  ];
  if (r.first_bad) {
    const where = [
      r.first_bad.line !== null ? `line ${r.first_bad.line}` : null,
      r.first_bad.seq !== null ? `seq ${r.first_bad.seq}` : null,
    ]
      .filter(Boolean)
      .join(', ');
    lines.push(`first bad${where ? ` (${where})` : ''}: ${r.first_bad.reason}`);
  }
  return lines.join('\n');
}
