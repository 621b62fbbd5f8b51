import { z } from 'zod';

export const ApprovalStatus = z.enum([
  'pending',
  'approved',
  'executing',
  'succeeded',
  'failed',
  'unknown',
  'rejected',
  'expired',
]);
export type ApprovalStatus = z.infer<typeof ApprovalStatus>;

export const Target = z.object({
  /** mcp_tool: a tool of an upstream MCP server, `<upstream>__<tool>`. */
  target_type: z.enum(['contact', 'group', 'conversation', 'mcp_tool']),
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

/** An approval request as agents see it (get_approval, list_approvals) and chairs review it. */
export const ApprovalView = z.object({
  approval_request_id: z.string(),
  status: ApprovalStatus,
  approval_id: z.string().nullable().describe('Issued once approved; pass it with dry_run=false to execute.'),
  tool: z.string(),
  target: Target,
  content_sha256: z.string(),
  file_sha256: z.string().nullable(),
  approvers: z.array(z.string()),
  required_approvers: z.number().int(),
  note: z.string().nullable(),
  created_at: z.string(),
  expires_at: z.string(),
  review_url: z.string(),
  execution: Execution.nullable(),
});
export type ApprovalView = z.infer<typeof ApprovalView>;

/** The short form returned by a dry run. */
export const ApprovalSummary = z.object({
  approval_request_id: z.string(),
  status: ApprovalStatus,
  review_url: z.string(),
  expires_at: z.string(),
});

export type RequestRow = {
  id: string;
  agent_id: string;
  tool: string;
  target_type: Target['target_type'];
  target_id: string;
  target_display: string | null;
  content_sha256: string;
  file_sha256: string | null;
  review: Record<string, unknown>;
  status: ApprovalStatus;
  approval_id: string | null;
  required_approvers: number;
  policy_version: string;
  note: string | null;
  created_at: string;
  expires_at: string;
  decided_at: string | null;
  execution_started_at: string | null;
  execution_finished_at: string | null;
  execution_result: Record<string, unknown> | null;
  execution_error: string | null;
  /** The connector the execution went to; null before execution and on rows executed before it was recorded. */
  execution_source: string | null;
};

const iso = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string).toISOString());
const json = (v: unknown) => (typeof v === 'string' ? JSON.parse(v) : v);

/** Normalises a database row (Date or string times, jsonb as object or string). */
export function requestFromDb(raw: Record<string, unknown>): RequestRow {
  return {
    ...(raw as unknown as RequestRow),
    review: json(raw.review) as Record<string, unknown>,
    execution_result: (json(raw.execution_result) as Record<string, unknown> | null) ?? null,
    created_at: iso(raw.created_at)!,
    expires_at: iso(raw.expires_at)!,
    decided_at: iso(raw.decided_at),
    execution_started_at: iso(raw.execution_started_at),
    execution_finished_at: iso(raw.execution_finished_at),
  };
}

const EXECUTION_STATES = new Set<ApprovalStatus>(['executing', 'succeeded', 'failed', 'unknown']);

export function toView(row: RequestRow, approvers: string[], reviewUrl: string): ApprovalView {
  return {
    approval_request_id: row.id,
    status: row.status,
    approval_id: row.approval_id,
    tool: row.tool,
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
