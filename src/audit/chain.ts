import { createHash } from 'node:crypto';
import { z } from 'zod';
import { canonicalPicker } from './canonical.ts';
import { AuditKind } from './kinds.ts';

export const GENESIS_HASH = '0'.repeat(64);

/** What a caller supplies for one audit row; the log adds seq, event_id, ts and the chain. */
export const AuditInput = z.strictObject({
  kind: AuditKind,
  request_id: z.string().nullish(),
  trace_id: z.string().nullish(),
  agent_id: z.string().nullish(),
  actor: z.string().nullish(),
  tool: z.string().nullish(),
  source: z.string().nullish(),
  target_type: z.string().nullish(),
  target_ref: z.string().nullish(),
  approval_request_id: z.string().nullish(),
  approval_id: z.string().nullish(),
  approvers: z.array(z.string()).nullish(),
  dry_run: z.boolean().nullish(),
  content_sha256: z.string().nullish(),
  file_sha256: z.string().nullish(),
  result: z.enum(['ok', 'error']).nullish(),
  error_code: z.string().nullish(),
  /** Never message bodies or secrets. */
  details: z.record(z.string(), z.unknown()).optional(),
});
export type AuditInput = z.input<typeof AuditInput>;

/** The fields covered by the hash, in the form they are stored and exported. */
export const AUDIT_FIELDS = [
  'seq',
  'event_id',
  'ts',
  'kind',
  'request_id',
  'trace_id',
  'agent_id',
  'actor',
  'tool',
  'source',
  'target_type',
  'target_ref',
  'approval_request_id',
  'approval_id',
  'approvers',
  'dry_run',
  'content_sha256',
  'file_sha256',
  'result',
  'error_code',
  'details',
] as const;

export type AuditBody = {
  seq: number;
  event_id: string;
  ts: string;
  kind: AuditKind;
  request_id: string | null;
  trace_id: string | null;
  agent_id: string | null;
  actor: string | null;
  tool: string | null;
  source: string | null;
  target_type: string | null;
  target_ref: string | null;
  approval_request_id: string | null;
  approval_id: string | null;
  approvers: string[] | null;
  dry_run: boolean | null;
  content_sha256: string | null;
  file_sha256: string | null;
  result: 'ok' | 'error' | null;
  error_code: string | null;
  details: Record<string, unknown>;
};

export type AuditRow = AuditBody & { prev_hash: string; hash: string };

/** RFC 8785 canonical JSON of the hashed fields of a row. */
export const canonicalRow: (body: AuditBody) => string = canonicalPicker(AUDIT_FIELDS);

/** hash = SHA-256(prev_hash || canonical row), hex. */
export function chainHash(prevHash: string, body: AuditBody): string {
  return createHash('sha256').update(prevHash).update(canonicalRow(body)).digest('hex');
}

/** Turns a database row (Date, string or number seq, jsonb) into the stored form that is hashed. */
export function rowFromDb(raw: Record<string, unknown>): AuditRow {
  const ts = raw.ts instanceof Date ? raw.ts.toISOString() : new Date(String(raw.ts)).toISOString();
  const json = (v: unknown) => (typeof v === 'string' ? JSON.parse(v) : v);
  return {
    seq: Number(raw.seq),
    event_id: String(raw.event_id),
    ts,
    kind: AuditKind.parse(raw.kind),
    request_id: (raw.request_id as string | null) ?? null,
    trace_id: (raw.trace_id as string | null) ?? null,
    agent_id: (raw.agent_id as string | null) ?? null,
    actor: (raw.actor as string | null) ?? null,
    tool: (raw.tool as string | null) ?? null,
    source: (raw.source as string | null) ?? null,
    target_type: (raw.target_type as string | null) ?? null,
    target_ref: (raw.target_ref as string | null) ?? null,
    approval_request_id: (raw.approval_request_id as string | null) ?? null,
    approval_id: (raw.approval_id as string | null) ?? null,
    approvers: (json(raw.approvers) as string[] | null) ?? null,
    dry_run: (raw.dry_run as boolean | null) ?? null,
    content_sha256: (raw.content_sha256 as string | null) ?? null,
    file_sha256: (raw.file_sha256 as string | null) ?? null,
    result: (raw.result as 'ok' | 'error' | null) ?? null,
    error_code: (raw.error_code as string | null) ?? null,
    details: (json(raw.details) as Record<string, unknown>) ?? {},
    prev_hash: String(raw.prev_hash),
    hash: String(raw.hash),
  };
}
