import { z } from 'zod';
import { ApprovalStatus, TargetType } from '../core/schemas.ts';

export const Target = z.object({
  target_type: TargetType,
  target_id: z.string(),
  display_name: z.string().nullable(),
});
export type Target = z.infer<typeof Target>;

export const Execution = z.object({
  status: z.enum(['executing', 'succeeded', 'failed', 'unknown']),
  started_at: z.string(),
  finished_at: z.string().nullable(),
  result: z.record(z.string(), z.unknown()).nullable(),
  error_code: z.string().nullable(),
});

/** Where a chair reviews a request; null when no web form is served for it (then the CLI decides). */
const ReviewUrl = z
  .string()
  .nullable()
  .describe(
    "The chair's review page; null when this server serves no web form (a chair approves with the CLI).",
  );

/** An approval request as agents see it (get_approval, list_approvals) and chairs review it. */
export const ApprovalView = z.object({
  approval_request_id: z.string(),
  status: ApprovalStatus,
  approval_id: z.string().nullable().describe('Issued once approved; pass it with dry_run=false to execute.'),
  tool: z
    .string()
    .describe(
      'The tool as agents call it: a built-in under the configured prefix (e.g. isphere_send_message), an upstream tool as <upstream>__<tool>.',
    ),
  source: z
    .string()
    .nullable()
    .describe(
      'Where the write goes: the connector it resolved to at the dry run (local, bridge, mcp:<name>); the approval is bound to it. Null on requests drafted before it was recorded.',
    ),
  target: Target,
  content_sha256: z.string(),
  file_sha256: z.string().nullable(),
  approvers: z.array(z.string()),
  required_approvers: z.number().int(),
  note: z.string().nullable(),
  created_at: z.string(),
  expires_at: z.string(),
  review_url: ReviewUrl,
  execution: Execution.nullable(),
});
export type ApprovalView = z.infer<typeof ApprovalView>;

/** What a dry run given an approval_id answers (approval/execute.ts preflightExecution). */
export const Preflight = z.object({
  would_execute: z.boolean(),
  code: z.string().nullable(),
  reason: z.string().nullable(),
  message: z.string().nullable(),
});

/** The short form returned by a dry run. */
export const ApprovalSummary = z.object({
  approval_request_id: z.string(),
  status: ApprovalStatus,
  review_url: ReviewUrl,
  next_step: z
    .string()
    .describe('What happens next, in words: who must approve and where, then how to execute.'),
  expires_at: z.string(),
});

/** What a request's binding asks, as its policy_requirement (null: the per-tool default) records it. */
interface Asked {
  policy_rule: string | null;
  policy_requirement: Record<string, unknown> | null;
  required_approvers: number;
}

/**
 * Who must approve a request, in words an agent can relay: "one approval from a chair", "2 approvals
 * from finance (rule "payments")", "2 approvals from ada or ben".
 */
export function asksOf(row: Asked): string {
  const req = row.policy_requirement as { roles?: string[]; users?: string[] } | null;
  const n = row.required_approvers;
  const count = n === 1 ? 'one approval' : `${n} approvals`;
  const from = req?.roles
    ? req.roles.join(' or ')
    : req?.users
      ? req.users.join(' or ')
      : n === 1
        ? 'a chair'
        : 'different chairs';
  return `${count} from ${from}${row.policy_rule ? ` (rule "${row.policy_rule}")` : ''}`;
}

/**
 * The next step after a dry run, for the agent to relay: who must approve (`asks`, asksOf), where (the
 * chair's review page, or, where this server serves no web form, the CLI command a chair runs), and
 * how to execute then, naming the tools as the agent calls them.
 */
export function nextStep(
  view: Pick<ApprovalView, 'approval_request_id' | 'status' | 'review_url'>,
  getApprovalTool: string,
  asks = 'one approval from a chair',
): string {
  const execute = `${getApprovalTool} gives its approval_id; repeat this call with dry_run: false and that approval_id.`;
  if (view.status === 'approved') return `Approved: ${execute}`;
  const where = view.review_url
    ? `in the web form at ${view.review_url}`
    : `with the CLI, as this server serves no web form: countersign approvals approve ${view.approval_request_id} --as <chair>`;
  return `This request needs ${asks}, given ${where}; then ${execute}`;
}

/** Times come back as Date (pg) or string (PGlite, raw rows); they leave as ISO 8601. */
const Timestamp = z.union([z.date(), z.string()]).transform((v) => new Date(v).toISOString());
/** jsonb comes back parsed (pg) or as text (some PGlite paths). */
const JsonObject = z
  .unknown()
  .transform((v) => (typeof v === 'string' ? (JSON.parse(v) as unknown) : v))
  .pipe(z.record(z.string(), z.unknown()));

/** A row of `approval_requests`, parsed at the database boundary (requestFromDb). */
export const RequestRow = z.object({
  id: z.string(),
  agent_id: z.string(),
  tool: z.string(),
  /** The connector the dry run resolved to; null on requests drafted before it was recorded. */
  source: z.string().nullable(),
  target_type: TargetType,
  target_id: z.string(),
  target_display: z.string().nullable(),
  content_sha256: z.string(),
  file_sha256: z.string().nullable(),
  review: JsonObject,
  status: ApprovalStatus,
  approval_id: z.string().nullable(),
  required_approvers: z.coerce.number().int(),
  policy_version: z.string(),
  /** The approval rule that matched at the dry run; null when none did (the per-tool default). */
  policy_rule: z.string().nullable().default(null),
  /** What that rule asked (approval/rules Requirement); null with policy_rule. */
  policy_requirement: JsonObject.nullable().default(null),
  note: z.string().nullable(),
  created_at: Timestamp,
  expires_at: Timestamp,
  decided_at: Timestamp.nullable(),
  execution_started_at: Timestamp.nullable(),
  execution_finished_at: Timestamp.nullable(),
  execution_result: JsonObject.nullable(),
  execution_error: z.string().nullable(),
  /** The connector the execution went to; null before execution and on rows executed before it was recorded. */
  execution_source: z.string().nullable(),
  /** The server's MAC over the binding and the decision (seal.ts); null until approved. */
  decision_mac: z.string().nullable().default(null),
});
export type RequestRow = z.output<typeof RequestRow>;

/** Parses a database row; a row that does not fit is a bug or a damaged table, and says which field. */
export const requestFromDb = (raw: Record<string, unknown>): RequestRow => RequestRow.parse(raw);

/**
 * A request with its agent's name, read with it (loadRow, AGENT_NAME_OF_R) or already in hand: what
 * every audit row about a request records in `details.agent_name`.
 */
export const NamedRequestRow = RequestRow.extend({ agent_name: z.string() });
export type NamedRequestRow = z.output<typeof NamedRequestRow>;

export const namedRequestFromDb = (raw: Record<string, unknown>): NamedRequestRow =>
  NamedRequestRow.parse(raw);

const EXECUTION_STATES = new Set<ApprovalStatus>(['executing', 'succeeded', 'failed', 'unknown']);

export function toView(row: RequestRow, approvers: string[], reviewUrl: string | null): ApprovalView {
  return {
    approval_request_id: row.id,
    status: row.status,
    approval_id: row.approval_id,
    tool: row.tool,
    source: row.source,
    target: { target_type: row.target_type, target_id: row.target_id, display_name: row.target_display },
    content_sha256: row.content_sha256,
    file_sha256: row.file_sha256,
    approvers,
    required_approvers: row.required_approvers,
    note: row.note,
    created_at: row.created_at,
    expires_at: row.expires_at,
    review_url: reviewUrl,
    execution:
      EXECUTION_STATES.has(row.status) && row.execution_started_at
        ? {
            status: row.status as 'executing' | 'succeeded' | 'failed' | 'unknown',
            started_at: row.execution_started_at,
            finished_at: row.execution_finished_at,
            result: row.execution_result,
            error_code: row.execution_error,
          }
        : null,
  };
}
