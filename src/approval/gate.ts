import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { ToolError } from '../tools/errors.ts';
import type { ToolContext, ToolOutcome, WriteToolDef } from '../tools/types.ts';
import { approvalRequired } from './execute.ts';

/** The controls every write tool's input carries. */
export interface WriteControls {
  dry_run: boolean;
  approval_id?: string;
  idempotency_key?: string;
}

/** SHA-256 of the RFC 8785 canonical JSON of the exact write: tool, target and content. */
export function contentSha256(
  tool: string,
  target: { target_type: string; target_id: string },
  content: object,
) {
  const write = { tool, target_type: target.target_type, target_id: target.target_id, ...content };
  return createHash('sha256').update(canonicalize(write)!).digest('hex');
}

/** Connector errors after which the write may or may not have happened: left for reconciliation. */
const INDETERMINATE = new Set(['TIMEOUT', 'SOURCE_UNAVAILABLE']);
/**
 * CONNECTOR_FAILED reasons that do not prove nothing was written: the other side accepted the request
 * but its answer was unreadable (a bridge's malformed body, an upstream's result breaking its own schema).
 */
const UNREADABLE_ANSWER = new Set(['malformed_answer', 'upstream_protocol_error']);

/** Whether a failed perform may still have written: then reconciliation, not the caller, settles it. */
const indeterminate = (err: ToolError) =>
  INDETERMINATE.has(err.code) || (err.reason !== undefined && UNREADABLE_ANSWER.has(err.reason));

function crashIf(ctx: ToolContext, step: 'after_write_started' | 'after_connector_write') {
  if (ctx.config.testing.crash_at === step) process.kill(process.pid, 'SIGKILL');
}

/**
 * The approval gate every write tool passes through (STYLE: write is a property). Dry run: create or
 * return the approval request for the exact content. Real run: bind-check and consume the approval in
 * one transaction (write.started), perform once with the approval_id as idempotency key, record the
 * outcome in a second transaction (write.succeeded / write.failed).
 */
export async function runWrite(
  tool: WriteToolDef,
  args: WriteControls & Record<string, unknown>,
  ctx: ToolContext,
): Promise<ToolOutcome<Record<string, unknown>>> {
  const prepared = await tool.prepare(args, ctx);
  const content_sha256 = contentSha256(tool.name, prepared.target, prepared.content);
  const facts = {
    source: prepared.source,
    target_type: prepared.target.target_type,
    target_ref: prepared.target.target_id,
    content_sha256,
    file_sha256: prepared.file_sha256,
  };

  if (args.dry_run) {
    const { view, created } = await ctx.approvals.request({
      agent: ctx.agent,
      tool: tool.name,
      target: prepared.target,
      content_sha256,
      file_sha256: prepared.file_sha256,
      review: prepared.review,
      request_id: ctx.request_id,
      trace_id: ctx.trace_id,
    });
    const approval = {
      approval_request_id: view.approval_request_id,
      status: view.status,
      review_url: view.review_url,
      expires_at: view.expires_at,
    };
    return {
      data: prepared.present({
        dry_run: true,
        send_status: 'planned',
        content_sha256,
        result: null,
        approval,
      }),
      audit: { ...facts, dry_run: true, details: { approval_request_id: view.approval_request_id, created } },
    };
  }

  if (ctx.dryRunOnly) {
    throw new ToolError(
      'DRY_RUN_ONLY',
      "this agent's profile allows this tool in dry run only",
      'profile_dry_run_only',
    );
  }
  if (!args.approval_id) throw approvalRequired('missing');
  const { row, replay } = await ctx.approvals.beginExecution({
    agent: ctx.agent,
    tool: tool.name,
    approval_id: args.approval_id,
    target: prepared.target,
    content_sha256,
    file_sha256: prepared.file_sha256,
    idempotency_key: args.idempotency_key,
    request_id: ctx.request_id,
    trace_id: ctx.trace_id,
    source: prepared.source,
  });
  const auditFacts = { ...facts, dry_run: false, approval_id: row.approval_id };

  if (replay) {
    if (row.status === 'succeeded') {
      return {
        data: prepared.present({
          dry_run: false,
          send_status: 'sent',
          content_sha256,
          result: row.execution_result,
          approval: null,
        }),
        audit: { ...auditFacts, details: { replayed: true, approval_request_id: row.id } },
      };
    }
    if (row.status === 'failed') {
      throw new ToolError(
        'CONNECTOR_FAILED',
        `the write with this idempotency_key failed (${row.execution_error})`,
        'replayed_failure',
      );
    }
    throw new ToolError(
      'IDEMPOTENCY_CONFLICT',
      `the write with this idempotency_key is ${row.status}`,
      'in_progress',
    );
  }

  crashIf(ctx, 'after_write_started');
  let result: Record<string, unknown>;
  try {
    result = await prepared.perform(row.approval_id!);
  } catch (err) {
    const known = err instanceof ToolError;
    if (!known || indeterminate(err)) throw err; // outcome unknown: reconciliation settles it
    await ctx.approvals.finishExecution(
      row,
      { status: 'failed', error_code: err.code, details: { reason: err.reason ?? null } },
      { request_id: ctx.request_id, trace_id: ctx.trace_id, source: prepared.source },
    );
    throw err;
  }
  crashIf(ctx, 'after_connector_write');
  await ctx.approvals.finishExecution(
    row,
    { status: 'succeeded', result },
    { request_id: ctx.request_id, trace_id: ctx.trace_id, source: prepared.source },
  );
  return {
    data: prepared.present({ dry_run: false, send_status: 'sent', content_sha256, result, approval: null }),
    audit: { ...auditFacts, details: { approval_request_id: row.id, ...result } },
  };
}
