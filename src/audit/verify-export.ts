import { createHash } from 'node:crypto';
import { GENESIS_HASH } from './chain.ts';
import {
  checkCheckpointRow,
  CheckpointRows,
  describeTail,
  trustOf,
  unanchoredTail,
  type UnanchoredTail,
} from './chain-checkpoints.ts';
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
  /** The checkpoint rows among the exported rows, each checked against the chain and the key. */
  checkpoint_rows: number;
  /** The exported rows no checkpoint recorded in the chain covers yet (seqs), when there are any. */
  tail?: UnanchoredTail;
  /** The first problem: the row (line and seq where known) and why. */
  first_bad?: { line: number | null; seq: number | null; reason: string };
}

/**
 * Verifies an export against its manifest, offline: the manifest's and the checkpoint's signatures,
 * each row's hash, the links between rows (for an unfiltered export), the count and the digest of all
 * row hashes (which catches deletions, insertions, reordering and truncation of a filtered export too).
 * `publicKeyPems`, when given, are the keys to trust: one of them must have signed the manifest, and
 * every checkpoint recorded in the rows (several keys when the key was rotated); otherwise the
 * manifest's key is used.
 */
export async function verifyExport(
  file: string,
  manifest: Manifest,
  publicKeyPems?: string | readonly string[],
): Promise<ExportReport> {
  const { given, publicKeyPem, key } = keysFor(manifest, publicKeyPems);
  const report: ExportReport = {
    ok: false,
    rows: 0,
    valid: 0,
    signature: 'valid',
    checkpoint: 'valid',
    checkpoint_rows: 0,
  };
  const fail = (line: number | null, seq: number | null, reason: string) => {
    report.first_bad ??= { line, seq, reason };
  };

  checkSignatures(manifest, key, publicKeyPem, report, fail);

  // The chain's own checkpoint rows: each must agree with the row before it and be signed by the key.
  const trust = trustOf(given.length > 0 ? given : key, manifest.checkpoint.origin);
  const chainCheckpoints = new CheckpointRows(trust);
  // For a filtered export, the first exported row after the checkpoint row the manifest names (and
  // the first of all, should that one not hold); for an unfiltered one the tail is read off the chain.
  const named = manifest.chain_checkpoint?.seq ?? 0;
  const read = await readRows(file, manifest, named, chainCheckpoints, report, fail);
  const { prev, lastCheckpointRow, firstAfterNamed, firstSeq, rowFault } = read;

  if (report.rows < manifest.row_count) {
    fail(
      null,
      prev ? prev.seq + 1 : manifest.first_seq,
      `truncated: ${report.rows} of ${manifest.row_count} rows present`,
    );
  } else if (report.rows > manifest.row_count) {
    fail(null, null, `extra rows: ${report.rows} present, the manifest lists ${manifest.row_count}`);
  } else if (read.digest !== manifest.rows_sha256) {
    fail(null, null, 'rows digest mismatch: rows were added, removed or reordered');
  }
  if (
    !manifest.filtered &&
    (prev?.hash !== manifest.checkpoint.head_hash || prev?.seq !== manifest.checkpoint.seq)
  ) {
    if (report.checkpoint === 'valid') report.checkpoint = 'does not match the rows';
    fail(null, prev?.seq ?? null, 'the last row is not the signed checkpoint head');
  }
  report.checkpoint_rows = chainCheckpoints.count;
  const anchored = anchoredThrough(manifest, chainCheckpoints, lastCheckpointRow, trust, fail);
  if (anchored !== undefined && prev && !report.first_bad) {
    const from = !manifest.filtered ? anchored + 1 : anchored === named ? firstAfterNamed : firstSeq;
    const tail = from !== undefined ? unanchoredTail(from - 1, prev.seq) : undefined;
    if (tail) report.tail = tail;
  }
  // A manifest edited after it was signed: say so, and whether the rows themselves hold.
  if (report.signature === 'bad signature' && report.first_bad?.reason === MANIFEST_BAD) {
    report.first_bad.reason = rowFault
      ? `${MANIFEST_BAD}: the manifest was altered after it was signed, and the rows have problems too`
      : `${MANIFEST_BAD}: the manifest was altered after it was signed (a field such as row_count changed); ` +
        `the rows themselves are intact: ${report.valid}/${report.rows} valid, their hashes, links and ` +
        'checkpoints hold. Export again for a manifest to trust';
  }
  report.ok = !report.first_bad;
  return report;
}

const MANIFEST_BAD = 'manifest signature is not valid';

/**
 * Reads the export's rows, checking each on its own and against the one before it: the rows counted
 * valid (up to the first with a problem of its own, whatever the manifest says), the first problem
 * given to `fail`, and what the checks after the rows need.
 */
async function readRows(
  file: string,
  manifest: Manifest,
  named: number,
  chainCheckpoints: CheckpointRows,
  report: ExportReport,
  fail: (line: number | null, seq: number | null, reason: string) => void,
) {
  let lastCheckpointRow: { seq: number; prev_hash: string } | undefined;
  let firstAfterNamed: number | undefined;
  let firstSeq: number | undefined;
  const digest = createHash('sha256');
  let prev: { seq: number; hash: string } | null = null;
  let rowFault = false;
  const rowFail = (line: number | null, seq: number | null, reason: string) => {
    rowFault = true;
    fail(line, seq, reason);
  };
  // A row whose seq jumps ahead: a missing row, or the first of two swapped ones; the next row tells.
  let gap: { line: number; seq: number; expected: number; reason: string } | undefined;
  for await (const items of readExport(file, manifest.format)) {
    let hashes = '';
    for (const item of items) {
      report.rows++;
      if ('error' in item) {
        rowFail(item.line, null, item.error);
        continue;
      }
      const row = item.facts;
      hashes += `${row.hash}\n`;
      if (gap) {
        rowFail(
          gap.line,
          gap.seq,
          row.seq === gap.expected
            ? `rows out of order at line ${gap.line}: seq ${gap.seq} comes before seq ${row.seq}`
            : gap.reason,
        );
        gap = undefined;
      }
      const problem = rowProblem(row, prev, manifest.filtered);
      if (problem?.startsWith('missing row') && !rowFault && prev)
        gap = { line: item.line, seq: row.seq, expected: prev.seq + 1, reason: problem };
      else if (problem) rowFail(item.line, row.seq, problem);
      else if (
        row.checkpoint &&
        !chainCheckpoints.push({ seq: row.seq, prev_hash: row.prev_hash, ...row.checkpoint })
      )
        rowFail(item.line, row.seq, chainCheckpoints.first_bad!.detail);
      else if (!rowFault) report.valid++;
      if (row.checkpoint) lastCheckpointRow = { seq: row.seq, prev_hash: row.prev_hash };
      firstSeq ??= row.seq;
      if (row.seq > named) firstAfterNamed ??= row.seq;
      prev = { seq: row.seq, hash: row.hash };
    }
    digest.update(hashes);
  }
  if (gap) rowFail(gap.line, gap.seq, gap.reason);
  return { prev, lastCheckpointRow, firstAfterNamed, firstSeq, rowFault, digest: digest.digest('hex') };
}

/** The keys given, the one of them that should have signed the manifest, and the key to check it with. */
function keysFor(manifest: Manifest, publicKeyPems: string | readonly string[] | undefined) {
  const given = publicKeyPems === undefined ? [] : [publicKeyPems].flat();
  const publicKeyPem = given.find((pem) => keyIdOf(pem) === manifest.key_id) ?? given[0];
  return { given, publicKeyPem, key: publicKeyPem ?? manifest.public_key };
}

/** The manifest's signature and its checkpoint's, by `key`. */
function checkSignatures(
  manifest: Manifest,
  key: string,
  publicKeyPem: string | undefined,
  report: ExportReport,
  fail: (line: number | null, seq: number | null, reason: string) => void,
): void {
  const { signature, ...unsigned } = manifest;
  if (publicKeyPem && keyIdOf(publicKeyPem) !== manifest.key_id) {
    report.signature = 'unknown key';
    fail(
      null,
      null,
      `manifest signed by key ${manifest.key_id}, not by the given key ${keyIdOf(publicKeyPem)}`,
    );
  } else if (!verifySignature(key, unsigned, signature)) {
    report.signature = 'bad signature';
    fail(null, null, MANIFEST_BAD);
  }
  if (!checkpointSignatureValid(manifest.checkpoint, key) || manifest.checkpoint.key_id !== manifest.key_id) {
    report.checkpoint = 'bad signature';
    fail(null, null, 'checkpoint signature is not valid');
  }
}

/**
 * How far the exported rows are covered by a checkpoint the chain recorded: for an unfiltered export
 * the last signed checkpoint row in it (which must be the one the manifest names); for a filtered one
 * the manifest's `chain_checkpoint`, checked on its own. Undefined when the manifest predates it and
 * the export is filtered (nothing to tell by).
 */
function anchoredThrough(
  manifest: Manifest,
  rows: CheckpointRows,
  lastRow: { seq: number; prev_hash: string } | undefined,
  trust: ReturnType<typeof trustOf>,
  fail: (line: number | null, seq: number | null, reason: string) => void,
): number | undefined {
  const named = manifest.chain_checkpoint;
  if (named && named.seq > manifest.checkpoint.seq) {
    fail(null, named.seq, `checkpoint row ${named.seq} is past the exported head ${manifest.checkpoint.seq}`);
    return undefined;
  }
  if (!manifest.filtered) {
    if (named !== undefined && (named?.seq !== lastRow?.seq || named?.prev_hash !== lastRow?.prev_hash)) {
      fail(
        null,
        named?.seq ?? lastRow?.seq ?? null,
        `the manifest's last checkpoint row (${named ? `seq ${named.seq}` : 'none'}) is not the last one in the rows (${lastRow ? `seq ${lastRow.seq}` : 'none'})`,
      );
    }
    return rows.anchoredThrough;
  }
  if (named === undefined) return undefined;
  if (named === null) return 0;
  const check = checkCheckpointRow(named, trust);
  if (check.fault) fail(null, named.seq, check.fault.detail);
  return check.signed ? named.seq : 0;
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
    `${r.checkpoint_rows} checkpoint${r.checkpoint_rows === 1 ? '' : 's'} recorded in the rows checked`,
  ];
  if (r.tail) lines.push(describeTail(r.tail));
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
