import fs from 'node:fs';
import { AppError } from '../../core/errors.ts';
import type { Manifest } from '../export.ts';
import { readExport } from '../read-export.ts';
import { checkAnchors, type AnchorReport } from './check.ts';
import { readAnchorsFile, storedAnchors, type Anchor } from './index.ts';
import { parseCertificates } from './tsa.ts';
import { readWitness } from './witness.ts';
import { recordedValue } from '../../db/settings.ts';
import type { Queryable } from '../../db/knex.ts';
import { events } from '../store/index.ts';

/** What to check a chain against: a TSA's certificate (PEM text), a witness directory, or both. */
export interface AnchorOptions {
  tsaCertPem?: string;
  witnessDir?: string;
  /** How far a token's genTime may lie from its checkpoint's time (audit.anchors.tsa_max_skew_s). */
  tsaMaxSkewS?: number;
  /** The origin the host roots pin; without it, the one the database records. */
  origin?: string;
}

function witnessOf(dir: string | undefined) {
  if (dir === undefined) return undefined;
  try {
    return readWitness(dir);
  } catch (err) {
    throw new AppError(
      'NOT_FOUND',
      `cannot read the witness directory ${dir}: ${(err as Error).message}`,
      'witness_dir',
      {
        cause: err,
      },
    );
  }
}

const certsOf = (pem: string | undefined) => (pem === undefined ? undefined : parseCertificates(pem));

/**
 * Checks an export against the anchors it carries (`anchorsFile`, default FILE.anchors.jsonl when present)
 * and those of a witness directory. The export's own checkpoint gives its origin, its end and when it was
 * signed.
 */
export async function verifyExportAnchors(
  file: string,
  manifest: Manifest,
  opts: AnchorOptions & { anchorsFile?: string },
): Promise<AnchorReport> {
  const anchorsFile = opts.anchorsFile ?? `${file}.anchors.jsonl`;
  const carried = fs.existsSync(anchorsFile) ? readAnchorsFile(anchorsFile) : { anchors: [], bad: [] };
  const report = await checkAnchors({
    origin: manifest.checkpoint.origin,
    tsaCerts: certsOf(opts.tsaCertPem),
    tsaMaxSkewS: opts.tsaMaxSkewS,
    witness: witnessOf(opts.witnessDir),
    anchors: carried.anchors,
    end: { seq: manifest.checkpoint.seq, live: false, signedAt: manifest.checkpoint.ts },
    async hashesAt(seqs) {
      const wanted = new Set(seqs);
      const found = new Map<number, string>();
      if (wanted.size === 0) return found;
      for await (const items of readExport(file, manifest.format))
        for (const item of items)
          if ('facts' in item && wanted.has(item.facts.seq)) found.set(item.facts.seq, item.facts.hash);
      return found;
    },
  });
  for (const line of carried.bad)
    report.findings.push({
      source: anchorsFile,
      seq: null,
      problem: 'unreadable',
      detail: `line ${line} is not an anchor`,
    });
  report.ok = report.findings.length === 0;
  return report;
}

/** Checks the live table against the stored time-stamp tokens and a witness directory. */
export async function verifyDatabaseAnchors(knex: Queryable, opts: AnchorOptions): Promise<AnchorReport> {
  const origin = opts.origin ?? (await recordedValue(knex, 'audit_origin'));
  const endSeq = await events.headSeq(knex);
  const anchors: Anchor[] = [];
  if (opts.tsaCertPem) for await (const a of storedAnchors(knex, 1, Number.MAX_SAFE_INTEGER)) anchors.push(a);
  return checkAnchors({
    origin: origin ?? '',
    tsaCerts: certsOf(opts.tsaCertPem),
    tsaMaxSkewS: opts.tsaMaxSkewS,
    witness: witnessOf(opts.witnessDir),
    anchors,
    end: { seq: endSeq, live: true },
    async hashesAt(seqs) {
      const found = new Map<number, string>();
      for (let i = 0; i < seqs.length; i += 1000) {
        const rows = await events.hashesOf(knex, seqs.slice(i, i + 1000));
        for (const r of rows) found.set(Number(r.seq), r.hash);
      }
      return found;
    },
  });
}
