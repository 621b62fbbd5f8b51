import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import type { z } from 'zod';
import { ANSWERS } from '../core/answers.ts';
import type { AuditFacts } from '../core/audit-kinds.ts';
import { AppError, isAppError } from '../core/errors.ts';
import { isConnectionError } from '../db/knex.ts';
import { outageOf } from '../db/outage.ts';
import type { Faults } from '../core/faults.ts';
import { isUuid } from '../core/ids.ts';
import type { Agent } from '../core/identity.ts';
import { approvalRequired, type ExecutionRequest, type Preflight } from './execute.ts';
import type { SeamApprovals } from './approvals.ts';
import type { TaskView } from './tasks.ts';
import { nextStep, type ApprovalSummary, type Target } from './view.ts';
import type { DraftFacts } from './ruling.ts';
import { refusalStep, withNextStep } from './next-steps.ts';

/** The controls every write tool's input carries. */
export interface WriteControls {
  dry_run: boolean;
  approval_id?: string;
  idempotency_key?: string;
}

/**
 * SHA-256 of the RFC 8785 canonical JSON of the exact write: tool, where it goes (the connector's source,
 * the target's type, id and display name as the chair sees it) and content. Where the write goes is in
 * the hash, not beside it: the same text drafted through another source or to a renamed target is
 * another request (the open-request index is on the hash), an idempotency_key spent on one is refused
 * for the other, and the hash a Slack button carries stands for all the chair saw.
 */
export function contentSha256(tool: string, source: string, target: Target, content: object) {
  const write = {
    ...content,
    tool,
    source,
    target_type: target.target_type,
    target_id: target.target_id,
    target_display: target.display_name,
  };
  return createHash('sha256').update(canonicalize(write)!).digest('hex');
}

/** Connector errors after which the write may or may not have happened: left for reconciliation. */
const INDETERMINATE = new Set(['TIMEOUT', 'SOURCE_UNAVAILABLE']);
/**
 * CONNECTOR_FAILED reasons that do not prove nothing was written: the other side accepted the request
 * but its answer was unreadable (a bridge's malformed body, an upstream's result breaking its own schema,
 * an upstream's answer past max_result_bytes).
 */
const UNREADABLE_ANSWER = new Set(['malformed_answer', 'upstream_protocol_error', 'result_too_large']);

/** Whether a failed perform may still have written: then reconciliation, not the caller, settles it. */
const indeterminate = (err: AppError) =>
  INDETERMINATE.has(err.code) || (err.reason !== undefined && UNREADABLE_ANSWER.has(err.reason));

/** What the gate shapes a write tool's output from. */
export interface WriteResult {
  dry_run: boolean;
  send_status: 'planned' | 'sent';
  content_sha256: string;
  /** The connector's references once written (message_ref, file_ref …). */
  result: Record<string, unknown> | null;
  approval: z.infer<typeof ApprovalSummary> | null;
  /** On a dry run given an approval_id: whether a real run with these arguments would be accepted. */
  preflight?: Preflight;
}

/** A write, resolved and checked but not performed: what the gate hashes, shows the chair, and runs. */
export interface PreparedWrite<T> {
  /** The connector's `source` (local, bridge, mcp:<name>). */
  source: string;
  target: Target;
  /** The exact write; hashed with the tool and target into content_sha256. */
  content: Record<string, unknown>;
  /** What the chair reviews. */
  review: Record<string, unknown>;
  /** What the connector told of the target for the approval rules (a group's size, whether it is internal). */
  target_facts?: { member_count?: number; external?: boolean };
  file_sha256: string | null;
  /** Performs the write exactly once per key (the approval_id). */
  perform(key: string): Promise<Record<string, unknown>>;
  present(r: WriteResult): T;
}

/** What the gate needs of the call: who asks, for which request, and the approval steps (never decide()). */
export interface GateContext {
  agent: Agent;
  request_id: string;
  trace_id: string;
  /** The agent's profile allows this tool's writes in dry run only. */
  dryRunOnly: boolean;
  approvals: Pick<
    SeamApprovals,
    'request' | 'preflight' | 'readApproval' | 'beginExecution' | 'finishExecution' | 'tasks'
  >;
  /**
   * Set when the client declared the Tasks extension on this call: a real run without an approval_id
   * is then drafted as a dry run and answered as a task that executes once approved. `tool` is the name
   * the agent called the tool by, which the task's runner calls again.
   */
  asTask?: { tool: string };
  /** Set when the task runner executes this call for the task: its rows say so. */
  task_id?: string;
  /** Test hooks; production wiring never provides them. */
  faults?: Faults;
  /**
   * Told what the execution has committed as it goes (write.started, then its outcome), so that a call
   * that cannot record its own row answers by how far the write got (server/answer.ts).
   */
  progress?: {
    start(approval_id: string, approval_request_id: string | null, inDoubt?: boolean): void;
    finish(status: 'succeeded' | 'failed', error_code?: string): void;
  };
  /** How the agent sees get_approval (config tools.prefix), for the next step of an unknown outcome. */
  getApprovalTool: string;
  /** The tool's facet, for the approval rules (send, upstream_write). */
  facet: string;
}

/** The audit facts of a write and the tool's own output fields. */
export interface GateOutcome {
  data: Record<string, unknown>;
  /** A write asked for as a task: the task created, answered instead of the envelope. */
  task?: TaskView;
  /** Every fact a write reports, approval_id once there is one. */
  audit: AuditFacts & Required<Omit<AuditFacts, 'approval_id'>>;
}

/** One write moving through the gate: what is written, its hash, and the audit facts every row repeats. */
interface Write {
  tool: string;
  prepared: PreparedWrite<Record<string, unknown>>;
  content_sha256: string;
  facts: Omit<GateOutcome['audit'], 'dry_run' | 'details' | 'approval_id'>;
}

/**
 * The approval gate every write tool passes through (STYLE: write is a property). Dry run: create or
 * return the approval request for the exact content. Real run: bind-check and consume the approval in
 * one transaction (write.started), perform once with the approval_id as idempotency key, record the
 * outcome in a second transaction (write.succeeded / write.failed).
 */
export async function runWrite(
  toolName: string,
  preparing: Promise<PreparedWrite<Record<string, unknown>>>,
  args: WriteControls,
  ctx: GateContext,
): Promise<GateOutcome> {
  // A real run's approval is read while the tool resolves its target: the two round trips overlap.
  const early = startsAtOnce(args, ctx) ? ctx.approvals.readApproval(args.approval_id) : undefined;
  // Awaited below, unless the tool's resolution fails first: then it is read for nothing, and dropped.
  early?.catch(() => undefined);
  const prepared = await preparing;
  const content_sha256 = contentSha256(toolName, prepared.source, prepared.target, prepared.content);
  const write: Write = {
    tool: toolName,
    prepared,
    content_sha256,
    facts: {
      source: prepared.source,
      target_type: prepared.target.target_type,
      target_ref: prepared.target.target_id,
      content_sha256,
      file_sha256: prepared.file_sha256,
    },
  };
  if (!args.dry_run && !args.approval_id && ctx.asTask) return draftTask(write, args, ctx, ctx.asTask);
  if (!args.dry_run) {
    return execute(write, args, ctx, early).catch((err: unknown) => {
      throw withNextStep(err, ctx.getApprovalTool, args.approval_id);
    });
  }
  return args.approval_id ? preflight(write, args, args.approval_id, ctx) : draft(write, args, ctx);
}

/** Dry run: the approval request for exactly this content (the agent's open one, if it has one). */
async function draft(write: Write, args: WriteControls, ctx: GateContext): Promise<GateOutcome> {
  const { view, created, asks } = await ctx.approvals.request({
    agent: ctx.agent,
    tool: write.tool,
    source: write.prepared.source,
    target: write.prepared.target,
    content_sha256: write.content_sha256,
    file_sha256: write.prepared.file_sha256,
    review: write.prepared.review,
    request_id: ctx.request_id,
    trace_id: ctx.trace_id,
    idempotency_key: args.idempotency_key,
    facts: factsOf(write, ctx),
  });
  const approval = {
    approval_request_id: view.approval_request_id,
    status: view.status,
    review_url: view.review_url,
    next_step: nextStep(view, ctx.getApprovalTool, asks),
    expires_at: view.expires_at,
  };
  return {
    data: planned(write, { approval }),
    audit: {
      ...write.facts,
      dry_run: true,
      details: { approval_request_id: view.approval_request_id, created },
    },
  };
}

const text = (v: unknown) => (typeof v === 'string' ? v : '');
const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * What the approval rules see of a write (approval/rules/input.ts), from what the tool prepared: the
 * message text or caption, the file, an upstream call and its arguments, the target.
 */
export function factsOf(write: Write, ctx: Pick<GateContext, 'facet'>): DraftFacts {
  const { content, review, target, target_facts } = write.prepared;
  const call = isRecord(review.upstream_call) ? review.upstream_call : undefined;
  return {
    facet: ctx.facet,
    target: { ...target, ...target_facts },
    text: text(content.content_text) || text(content.caption),
    file:
      typeof review.file_size_bytes === 'number'
        ? { name: text(review.file_name), size: review.file_size_bytes, type: text(review.mime_type) }
        : undefined,
    upstream: call && {
      name: text(call.upstream),
      tool: text(call.tool),
      arguments: isRecord(call.arguments) ? call.arguments : {},
    },
  };
}

/**
 * A real run asked for as a task, with no approval_id: drafted exactly as its dry run (the same request,
 * hash and notices), and a task that follows the request; the runner executes it once approved.
 */
async function draftTask(
  write: Write,
  args: WriteControls,
  ctx: GateContext,
  asTask: { tool: string },
): Promise<GateOutcome> {
  if (ctx.dryRunOnly) throw dryRunOnly();
  const drafted = await draft(write, { ...args, dry_run: true }, ctx);
  const approval_request_id = drafted.audit.details.approval_request_id as string;
  const task = await ctx.approvals.tasks.create({
    agent_id: ctx.agent.id,
    approval_request_id,
    tool: asTask.tool,
    arguments: { ...args, dry_run: false },
  });
  return {
    ...drafted,
    task,
    audit: { ...drafted.audit, details: { ...drafted.audit.details, task_id: task.taskId } },
  };
}

/** A dry run's output: nothing written, the approval request or the preflight answer beside it. */
const planned = (write: Write, with_: Pick<WriteResult, 'approval' | 'preflight'>) =>
  write.prepared.present({
    dry_run: true,
    send_status: 'planned',
    content_sha256: write.content_sha256,
    result: null,
    ...with_,
  });

/** The refusal of a real run by an agent whose profile allows this tool in dry run only. */
const dryRunOnly = () =>
  new AppError(
    'DRY_RUN_ONLY',
    "this agent's profile allows this tool in dry run only",
    'profile_dry_run_only',
  );

/** The execution request this write makes with `approval_id`. */
const executionOf = (
  write: Write,
  approval_id: string,
  args: WriteControls,
  ctx: GateContext,
): ExecutionRequest => ({
  agent: ctx.agent,
  tool: write.tool,
  approval_id,
  target: write.prepared.target,
  content_sha256: write.content_sha256,
  file_sha256: write.prepared.file_sha256,
  idempotency_key: args.idempotency_key,
  request_id: ctx.request_id,
  trace_id: ctx.trace_id,
  source: write.prepared.source,
  facts: factsOf(write, ctx),
  ...(ctx.task_id ? { task_id: ctx.task_id } : {}),
});

/**
 * Dry run with an approval_id: no new request, nothing consumed — the answer says whether a real run
 * with these arguments would be accepted now, or exactly why not.
 */
async function preflight(
  write: Write,
  args: WriteControls,
  approval_id: string,
  ctx: GateContext,
): Promise<GateOutcome> {
  const refused = ctx.dryRunOnly ? dryRunOnly() : undefined;
  const check: Preflight = refused
    ? { would_execute: false, code: refused.code, reason: refused.reason ?? null, message: refused.message }
    : withStep(await ctx.approvals.preflight(executionOf(write, approval_id, args, ctx)), ctx);
  return {
    data: planned(write, { approval: null, preflight: check }),
    audit: {
      ...write.facts,
      dry_run: true,
      approval_id: isUuid(approval_id) ? approval_id : null,
      details: { preflight: check.would_execute, ...(check.reason ? { reason: check.reason } : {}) },
    },
  };
}

/** A preflight's refusal with what to do next, as the real run would answer it. */
function withStep(check: Preflight, ctx: GateContext): Preflight {
  const step =
    check.code === 'APPROVAL_REQUIRED' ? refusalStep(check.reason, ctx.getApprovalTool) : undefined;
  return step && check.message ? { ...check, message: `${check.message}; next: ${step}` } : check;
}

/** Whether a real run may start in one statement (no idempotency key): its approval is read early. */
const startsAtOnce = (
  args: WriteControls,
  ctx: GateContext,
): args is WriteControls & { approval_id: string } =>
  !args.dry_run && !ctx.dryRunOnly && !args.idempotency_key && isUuid(args.approval_id);

/** Real run: consume the approval (or replay the key's stored outcome), perform once, record the outcome. */
async function execute(
  write: Write,
  args: WriteControls,
  ctx: GateContext,
  early?: ReturnType<GateContext['approvals']['readApproval']>,
): Promise<GateOutcome> {
  if (ctx.dryRunOnly) throw dryRunOnly();
  if (!args.approval_id) throw approvalRequired('missing');
  const request = executionOf(write, args.approval_id, args, ctx);
  const approval_id = args.approval_id;
  const { row, replay } = await ctx.approvals.beginExecution(request, early).catch(async (err: unknown) => {
    // The connection ended while the statement that spends the approval was out: it may have committed,
    // so the call answers as a write that may have started, never as one that did nothing.
    if (sentBeforeOutage(err)) {
      const read = await early?.catch(() => undefined);
      ctx.progress?.start(approval_id, typeof read?.id === 'string' ? read.id : null, true);
    }
    throw err;
  });
  if (replay) return replayed(write, row);
  ctx.progress?.start(row.approval_id!, row.id);

  let result: Record<string, unknown>;
  try {
    await ctx.faults?.at('after_write_started');
    result = await perform(write, row, ctx);
    await ctx.faults?.at('after_connector_write');
    const finished = await ctx.approvals.finishExecution(
      row,
      { status: 'succeeded', result },
      finishContext(write, ctx),
    );
    if (finished) ctx.progress?.finish('succeeded');
  } catch (err) {
    throw outageOf(err) ? outcomeUnknown(row, ctx, err) : err;
  }
  return {
    data: write.prepared.present({
      dry_run: false,
      send_status: 'sent',
      content_sha256: write.content_sha256,
      result,
      approval: null,
    }),
    audit: {
      ...write.facts,
      dry_run: false,
      approval_id: row.approval_id,
      details: { approval_request_id: row.id, ...result },
    },
  };
}

/** What the outcome's row repeats of the call: its ids, the connector, and the task it ran for. */
const finishContext = (write: Write, ctx: GateContext) => ({
  request_id: ctx.request_id,
  trace_id: ctx.trace_id,
  source: write.prepared.source,
  ...(ctx.task_id ? { task_id: ctx.task_id } : {}),
});

type ExecutingRow = Awaited<ReturnType<SeamApprovals['beginExecution']>>['row'];

/**
 * The answer to an execution the database went away from after write.started committed: the write may
 * have happened (the connector may have delivered it) and its outcome is not recorded yet. Never "not
 * done, retry": the approval is spent, reconciliation settles it, and get_approval then shows the outcome.
 */
function outcomeUnknown(row: ExecutingRow, ctx: GateContext, cause: unknown): AppError {
  const { code, reason } = ANSWERS['outage.started'].envelope;
  return new AppError(
    code,
    'this write started, and whether it was made is not known yet (the database became unavailable); ' +
      `do not repeat it, check its outcome with ${ctx.getApprovalTool}`,
    reason,
    { cause, details: outcomeUnknownDetails(row.approval_id!, row.id, ctx.getApprovalTool) },
  );
}

/** Where an unknown outcome is looked up: the approval, and get_approval as the next step. */
const outcomeUnknownDetails = (approval_id: string, approval_request_id: string, tool: string) => ({
  approval_id,
  approval_request_id,
  next_step: { tool, arguments: { approval_id } },
});

/**
 * The connector's write, keyed by the approval_id. A failure that proves nothing was written is
 * recorded (write.failed); one that may have written is left executing for reconciliation.
 */
async function perform(write: Write, row: ExecutingRow, ctx: GateContext) {
  try {
    return await write.prepared.perform(row.approval_id!);
  } catch (err) {
    if (!(err instanceof AppError) || indeterminate(err)) throw err;
    const finished = await ctx.approvals.finishExecution(
      row,
      { status: 'failed', error_code: err.code, details: { reason: err.reason ?? null } },
      finishContext(write, ctx),
    );
    if (finished) ctx.progress?.finish('failed', err.code);
    throw err;
  }
}

/** A repeated idempotency key: the first execution's outcome, never a second write. */
function replayed(write: Write, row: ExecutingRow): GateOutcome {
  if (row.status === 'succeeded') {
    return {
      data: write.prepared.present({
        dry_run: false,
        send_status: 'sent',
        content_sha256: write.content_sha256,
        result: row.execution_result,
        approval: null,
      }),
      audit: {
        ...write.facts,
        dry_run: false,
        approval_id: row.approval_id,
        details: { replayed: true, approval_request_id: row.id },
      },
    };
  }
  if (row.status === 'failed') {
    throw new AppError(
      'CONNECTOR_FAILED',
      `the write with this idempotency_key failed (${row.execution_error})`,
      'replayed_failure',
    );
  }
  throw new AppError(
    'IDEMPOTENCY_CONFLICT',
    `the write with this idempotency_key is ${row.status}`,
    'in_progress',
  );
}

/**
 * Whether a failure of the database may have come after a statement reached it: a connection that
 * ended or a server that shut down mid-statement. A connection that could not be made, or a pool that
 * gave none, sent nothing.
 */
function sentBeforeOutage(err: unknown): boolean {
  // The audit log names the outage (audit_unavailable) with the connection's error as its cause.
  const cause = isAppError(err, 'SOURCE_UNAVAILABLE', 'audit_unavailable') ? err.cause : err;
  if (!isConnectionError(cause)) return false;
  const e = cause as { code?: unknown; name?: unknown };
  return !(
    e.name === 'KnexTimeoutError' ||
    ['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', '57P03', '08001', '08004'].includes(String(e.code))
  );
}
