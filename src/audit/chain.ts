import { hash } from 'node:crypto';
import { z } from 'zod';
import { canonicalPicker } from './canonical.ts';
import { AuditKind, AuditResult } from '../core/audit-kinds.ts';

export const GENESIS_HASH = '0'.repeat(64);

/** A column a caller may leave out: stored as null. */
const column = <T extends z.ZodType>(type: T) => type.nullable().default(null);
const text = () => column(z.string());

/**
 * The fields of an audit row that its hash covers, in table order, as they are stored, hashed and
 * exported: every field present, null where unset. The one declaration of the row: the insert shape,
 * the canonical field list, the export columns and the types are derived from it.
 *
 * target_type and error_code stay free text: rows already in the chain carry values outside the
 * TargetType and AuditErrorCode enums ('file' and 'message' targets, reconciliation's NOT_WRITTEN and
 * OUTCOME_UNKNOWN), and a verifier must read every row it has ever written.
 */
const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && [Object.prototype, null].includes(Object.getPrototypeOf(v));

export const AuditBody = z.object({
  seq: z.number().int().positive(),
  /** A uuid column. */
  event_id: z.string(),
  ts: z.iso.datetime(),
  kind: AuditKind,
  request_id: text(),
  trace_id: text(),
  agent_id: text(),
  actor: text(),
  tool: text(),
  source: text(),
  target_type: text(),
  target_ref: text(),
  approval_request_id: text(),
  approval_id: text(),
  approvers: column(z.array(z.string())),
  dry_run: column(z.boolean()),
  content_sha256: text(),
  file_sha256: text(),
  result: column(AuditResult),
  error_code: text(),
  /**
   * Never message bodies or secrets. Copied by a spread, not key by key: a copy by assignment drops
   * an own `__proto__` key (z.record does), and the row would then hash otherwise than it was
   * appended (test/store/audit-pages.test.ts found one).
   */
  details: z
    .custom<Record<string, unknown>>((v) => isPlainObject(v), { message: 'details: expected an object' })
    // A spread defines each own key, `__proto__` too, on an ordinary object.
    .transform((v) => ({ ...v }))
    .default(() => ({})),
});
export type AuditBody = z.infer<typeof AuditBody>;

/** A stored row: its body, and the chain links that follow it in the table (hex SHA-256). */
export const AuditRow = AuditBody.extend({ prev_hash: z.string(), hash: z.string() });
export type AuditRow = z.infer<typeof AuditRow>;

/**
 * What a caller supplies for one audit row; the log adds seq, event_id, ts and the chain. Compiled, as
 * every call is audited.
 */
export const AuditInput = z.compile(
  z.strictObject(AuditBody.omit({ seq: true, event_id: true, ts: true }).shape),
);
export type AuditInput = z.input<typeof AuditInput>;

const KINDS: ReadonlySet<unknown> = new Set(AuditKind.options);
const RESULTS: ReadonlySet<unknown> = new Set([...AuditResult.options, null, undefined]);
const TEXT_FIELDS = [
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
  'content_sha256',
  'file_sha256',
  'error_code',
] as const satisfies readonly (keyof AuditInput)[];
const INPUT_KEYS: ReadonlySet<string> = new Set(Object.keys(AuditInput.shape));

const isText = (v: unknown) => v === undefined || v === null || typeof v === 'string';

/**
 * An audit input as AuditInput parses it: every field present, null where unset, details `{}` unless
 * given. The inputs every call appends are checked here by hand, a few comparisons, instead of by the
 * schema (about 18 µs of a sequential call's path in the server, against under 1 µs in a hot loop);
 * anything the checks do not accept — an unknown key, a value of the wrong type — goes to
 * AuditInput.parse, which accepts what it accepts and throws what it throws, as before.
 */
export function auditInput(input: AuditInput): z.output<typeof AuditInput> {
  const i = input as Record<string, unknown>;
  let plain =
    KINDS.has(i.kind) &&
    RESULTS.has(i.result) &&
    (i.dry_run === undefined || i.dry_run === null || typeof i.dry_run === 'boolean') &&
    (i.approvers === undefined ||
      i.approvers === null ||
      (Array.isArray(i.approvers) && i.approvers.every((a) => typeof a === 'string'))) &&
    (i.details === undefined || isPlainObject(i.details)) &&
    TEXT_FIELDS.every((f) => isText(i[f]));
  if (plain) for (const key in i) if (!INPUT_KEYS.has(key)) plain = false;
  if (!plain) return AuditInput.parse(input);
  return {
    kind: input.kind,
    request_id: input.request_id ?? null,
    trace_id: input.trace_id ?? null,
    agent_id: input.agent_id ?? null,
    actor: input.actor ?? null,
    tool: input.tool ?? null,
    source: input.source ?? null,
    target_type: input.target_type ?? null,
    target_ref: input.target_ref ?? null,
    approval_request_id: input.approval_request_id ?? null,
    approval_id: input.approval_id ?? null,
    approvers: input.approvers ? [...input.approvers] : null,
    dry_run: input.dry_run ?? null,
    content_sha256: input.content_sha256 ?? null,
    file_sha256: input.file_sha256 ?? null,
    result: input.result ?? null,
    error_code: input.error_code ?? null,
    details: input.details ? { ...input.details } : {},
  };
}

/** The fields covered by the hash. */
export type AuditField = keyof AuditBody;
export const AUDIT_FIELDS: readonly AuditField[] = AuditBody.keyof().options;

/**
 * RFC 8785 canonical JSON of the hashed fields of a row. Typed loosely on purpose: the export verifier
 * hashes rows it does not trust yet, whatever their fields hold; a field that is absent is left out.
 */
export const canonicalRow: (body: { readonly [F in AuditField]?: unknown }) => string =
  canonicalPicker(AUDIT_FIELDS);

/** hash = SHA-256(prev_hash || canonical row), hex. One call, no Hash object: every append hashes. */
export function chainHash(prevHash: string, body: Parameters<typeof canonicalRow>[0]): string {
  return hash('sha256', prevHash + canonicalRow(body), 'hex');
}

/**
 * An audit_events row as both drivers return it (bigint as a number, see db/knex.ts; jsonb parsed):
 * only ts differs from the stored form, a Date. Columns outside the row (a join's) are dropped.
 * Compiled: every export and verification parses each row once.
 */
export const AuditRowFromDb = z.compile(AuditRow.extend({ ts: z.date().transform((d) => d.toISOString()) }));

/** The head of the chain as the database returns it: its last row's seq and hash. */
export const ChainHeadFromDb = AuditRowFromDb.pick({ seq: true, hash: true });
export type ChainHead = z.infer<typeof ChainHeadFromDb>;

/** Parses a row read from audit_events into the stored form that is hashed. */
export const rowFromDb = (raw: unknown): AuditRow => AuditRowFromDb.parse(raw);
