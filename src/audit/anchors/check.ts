import type * as pkijs from 'pkijs';
import { checkpointSignatureValid, type Checkpoint } from '../checkpoints.ts';
import type { Anchor } from './index.ts';
import { checkToken } from './tsa.ts';
import { statementBytes, type WitnessEntry } from './witness.ts';

/**
 * Checks a chain (the live table, or an export) against the heads anchored off the box: time-stamp tokens
 * (checked against the authority's certificate) and the checkpoints of a witness directory. A head anchored
 * at a seq the chain holds must be that row's hash; one anchored beyond the chain's end, before the chain
 * was last signed (or at all, for the live table), means newest rows were deleted.
 */

export type AnchorProblem = 'differs' | 'deleted' | 'bad_token' | 'bad_signature' | 'unreadable' | 'none';

export interface AnchorFinding {
  /** `tsa` (a stored or carried token), or the witness file's name. */
  source: string;
  seq: number | null;
  problem: AnchorProblem;
  detail: string;
}

export interface AnchorReport {
  ok: boolean;
  /** Anchors compared with a row of the chain and found equal. */
  matching: number;
  /** Anchors that could not be compared: beyond an export's end and made after it, or rows filtered out. */
  unchecked: number;
  findings: AnchorFinding[];
}

export interface AnchorCheck {
  /** The log's origin: anchors of other logs are left aside. */
  origin: string;
  /** Check time-stamp tokens, signed by (or issued under) these certificates. */
  tsaCerts?: pkijs.Certificate[];
  /** How far a token's genTime may lie from its checkpoint's time (default DEFAULT_TSA_MAX_SKEW_S). */
  tsaMaxSkewS?: number;
  /** Check the heads of a witness directory. */
  witness?: { entries: WitnessEntry[]; unreadable: string[] };
  /** Tokens stored in the database or carried by the export. */
  anchors: Anchor[];
  /** The chain's end: the live table's last row, or an export's checkpoint and when it was signed. */
  end: { seq: number; live: boolean; signedAt?: string };
  /** The chain's hash at each of these seqs, where it has a row. */
  hashesAt(seqs: number[]): Promise<Map<number, string>>;
}

interface Claim {
  source: string;
  checkpoint: Checkpoint;
  /** When the head was anchored: the token's time, or the witnessed checkpoint's. */
  at: Date;
}

type Findings = AnchorFinding[];

/** The heads time-stamp tokens anchor, each token checked against the trusted certificates. */
async function tokenClaims(
  input: AnchorCheck,
  certs: pkijs.Certificate[],
  findings: Findings,
): Promise<Claim[]> {
  const ours = (cp: Checkpoint) => cp.origin === input.origin;
  const tokens = new Map<string, { source: string; checkpoint: Checkpoint }>();
  for (const a of input.anchors)
    if (ours(a.checkpoint)) tokens.set(a.token, { source: 'tsa', checkpoint: a.checkpoint });
  for (const e of input.witness?.entries ?? [])
    if (e.tsa_token && ours(e.checkpoint))
      tokens.set(e.tsa_token, { source: e.file, checkpoint: e.checkpoint });
  if (tokens.size === 0 && input.end.seq > 0)
    findings.push({
      source: 'tsa',
      seq: null,
      problem: 'none',
      detail: 'no time-stamp token of this log to check',
    });
  const claims: Claim[] = [];
  for (const [token, { source, checkpoint }] of tokens) {
    const result = await checkToken(Buffer.from(token, 'base64'), statementBytes(checkpoint), {
      trusted: certs,
      signedAt: new Date(checkpoint.ts),
      maxSkewS: input.tsaMaxSkewS,
    });
    if (result.ok) claims.push({ source, checkpoint, at: result.genTime });
    else
      findings.push({
        source,
        seq: checkpoint.seq,
        problem: 'bad_token',
        detail: `time-stamp token of seq ${checkpoint.seq}: ${result.problem} (${result.detail})`,
      });
  }
  return claims;
}

/** The heads a witness directory holds, each checkpoint's signature checked. */
function witnessClaims(
  input: AnchorCheck,
  witness: NonNullable<AnchorCheck['witness']>,
  findings: Findings,
): Claim[] {
  for (const name of witness.unreadable)
    findings.push({
      source: name,
      seq: null,
      problem: 'unreadable',
      detail: `${name} is not a witness entry`,
    });
  const entries = witness.entries.filter((e) => e.checkpoint.origin === input.origin);
  if (entries.length === 0 && input.end.seq > 0)
    findings.push({
      source: 'witness',
      seq: null,
      problem: 'none',
      detail: 'the witness directory holds no checkpoint of this log',
    });
  const claims: Claim[] = [];
  for (const e of entries) {
    if (checkpointSignatureValid(e.checkpoint))
      claims.push({ source: e.file, checkpoint: e.checkpoint, at: new Date(e.checkpoint.ts) });
    else
      findings.push({
        source: e.file,
        seq: e.checkpoint.seq,
        problem: 'bad_signature',
        detail: `${e.file}: bad checkpoint signature`,
      });
  }
  return claims;
}

export async function checkAnchors(input: AnchorCheck): Promise<AnchorReport> {
  const findings: Findings = [];
  const claims = [
    ...(input.tsaCerts ? await tokenClaims(input, input.tsaCerts, findings) : []),
    ...(input.witness ? witnessClaims(input, input.witness, findings) : []),
  ];
  const hashes = await input.hashesAt(
    [...new Set(claims.map((c) => c.checkpoint.seq))].filter((s) => s <= input.end.seq),
  );
  let matching = 0;
  let unchecked = 0;
  const signedAt = input.end.signedAt ? new Date(input.end.signedAt) : undefined;
  for (const { source, checkpoint: cp, at } of claims) {
    if (cp.seq > input.end.seq) {
      if (input.end.live || (signedAt && at < signedAt))
        findings.push({
          source,
          seq: cp.seq,
          problem: 'deleted',
          detail: `${source}: head anchored at seq ${cp.seq} (${at.toISOString()}), but the chain ends at seq ${input.end.seq}: rows deleted`,
        });
      else unchecked++;
      continue;
    }
    const hash = hashes.get(cp.seq);
    if (hash === undefined && !input.end.live) unchecked++;
    else if (hash === cp.head_hash) matching++;
    else
      findings.push({
        source,
        seq: cp.seq,
        problem: 'differs',
        detail: `${source}: head anchored at seq ${cp.seq} differs from the chain's row ${cp.seq}`,
      });
  }
  return { ok: findings.length === 0, matching, unchecked, findings };
}

export function describeAnchors(report: AnchorReport): string {
  const lines = [
    `anchors: ${report.matching} anchored head${report.matching === 1 ? '' : 's'} match the chain${report.unchecked ? `, ${report.unchecked} not comparable` : ''}; ${report.ok ? 'valid' : 'NOT valid'}`,
  ];
  for (const f of report.findings.slice(0, 20)) lines.push(`${f.problem}: ${f.detail}`);
  if (report.findings.length > 20) lines.push(`… and ${report.findings.length - 20} more`);
  return lines.join('\n');
}
