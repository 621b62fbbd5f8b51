import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { isUuid } from '../core/ids.ts';
import { ApprovalStatus } from '../core/schemas.ts';
import { retryingTransaction } from '../db/retry.ts';
import { requestFacts, type ApprovalDeps } from './deps.ts';
import { deliveriesFor } from './outbox.ts';
import { requests, tasks } from './store/index.ts';
import { requestFromDb, type RequestRow } from './view.ts';

/*
 * Writes asked for as MCP tasks (docs/design.md "Asked as a task"). A task follows one approval request:
 * while it has no outcome of its own, its state is read from the request in the same statement, so a
 * decision taken on any replica shows on every replica at once, and a task needs no change when its
 * request is rejected or expires. Only the runner, once the request is approved, gives a task its
 * outcome: the result of the write, executed through the same gate as an agent's own execution.
 */

/** How often a requester is asked to poll a working task. */
export const TASK_POLL_INTERVAL_MS = 1000;

/** The JSON-RPC error code of a failed task; `data.code` says why (APPROVAL_REQUIRED, OUTCOME_UNKNOWN…). */
export const TASK_FAILED = -32010;

export const TaskStatus = z.enum(['working', 'completed', 'failed', 'cancelled']);
export type TaskStatus = z.infer<typeof TaskStatus>;

/** A JSON-RPC error as a failed task carries it. */
export interface TaskError {
  code: number;
  message: string;
  data?: Record<string, unknown>;
}

/** A task as requesters see it (the Tasks extension's Task, with its result or error once terminal). */
export interface TaskView {
  taskId: string;
  status: TaskStatus;
  statusMessage: string;
  createdAt: string;
  lastUpdatedAt: string;
  /** How long the task is kept from its creation: as long as its request may wait for a decision. */
  ttlMs: number;
  pollIntervalMs: number;
  result?: Record<string, unknown>;
  error?: TaskError;
}

const Timestamp = z.union([z.date(), z.string()]).transform((v) => new Date(v).toISOString());
const Json = z.unknown().transform((v) => (typeof v === 'string' ? (JSON.parse(v) as unknown) : v));

/** A row of approval_tasks, parsed at the database boundary. */
const TaskRow = z.object({
  id: z.string(),
  approval_request_id: z.string(),
  agent_id: z.string(),
  tool: z.string(),
  arguments: Json.pipe(z.record(z.string(), z.unknown())),
  status: TaskStatus,
  outcome: Json.pipe(z.record(z.string(), z.unknown()).nullable()),
  claimed_at: Timestamp.nullable(),
  created_at: Timestamp,
  updated_at: Timestamp,
});
type TaskRow = z.output<typeof TaskRow>;

/** A task and its request as one read gives them. */
interface TaskWithRequest {
  task: TaskRow;
  request: Pick<RequestRow, 'id' | 'status' | 'note' | 'approval_id' | 'expires_at' | 'decided_at'> & {
    review_url: string | null;
  };
}

function parseJoined(deps: ApprovalDeps, raw: Record<string, unknown>): TaskWithRequest {
  const task = TaskRow.parse(raw);
  const r_row = typeof raw.r_row === 'string' ? (JSON.parse(raw.r_row) as unknown) : raw.r_row;
  const request = requestFromDb(r_row as Record<string, unknown>);
  return {
    task,
    request: {
      id: request.id,
      status: request.status,
      note: request.note,
      approval_id: request.approval_id,
      expires_at: request.expires_at,
      decided_at: request.decided_at,
      review_url: deps.reviewUrl(request.id),
    },
  };
}

/** The task `id` of `agent_id`, with its whole request as `r_row`; undefined when it is another's or none. */
async function loadTask(deps: ApprovalDeps, agent_id: string, where: { id?: string; request?: string }) {
  const raw = await tasks.taskOf(deps.knex, agent_id, where);
  return raw ? parseJoined(deps, raw) : undefined;
}

/** What a task created for a drafted write holds: whose it is, which request it follows, what runs. */
export interface NewTask {
  agent_id: string;
  approval_request_id: string;
  /** The tool as the agent called it. */
  tool: string;
  /** The validated arguments; the runner adds dry_run false, the approval_id and an idempotency key. */
  arguments: Record<string, unknown>;
}

/** The request statuses under which a working task is claimed by the runner (claimRunnable). */
const RUNNABLE = new Set(['approved', 'succeeded', 'failed']);

/**
 * The task that follows the request of a drafted write: a new one, or the one the agent already has for
 * that request (a repeated ask, like a repeated dry run, finds the first).
 */
export async function createTask(deps: ApprovalDeps, draft: NewTask): Promise<TaskView> {
  const now = new Date().toISOString();
  await tasks.insertTask(deps.knex, {
    id: randomUUID(),
    approval_request_id: draft.approval_request_id,
    agent_id: draft.agent_id,
    tool: draft.tool,
    arguments: JSON.stringify(draft.arguments),
    status: 'working',
    created_at: now,
    updated_at: now,
  });
  const found = await loadTask(deps, draft.agent_id, { request: draft.approval_request_id });
  if (!found) throw new Error('the task of a drafted request is missing');
  // A task runnable as it is made (its request approved by a rule as it was drafted, or decided before
  // the ask): no decision follows to wake the runner, so this does.
  if (found.task.status === 'working' && RUNNABLE.has(found.request.status)) deps.onTaskApproved?.();
  return taskView(found);
}

/** The agent's own task by id; undefined for an unknown id or another agent's task. */
export async function getTask(
  deps: ApprovalDeps,
  agent_id: string,
  id: string,
): Promise<TaskView | undefined> {
  if (!isUuid(id)) return undefined;
  const found = await loadTask(deps, agent_id, { id });
  return found ? taskView(found) : undefined;
}

/**
 * The agent's own tasks among `ids` (at most one read): another agent's id and an unknown one are
 * left out alike. What a listen stream watching these tasks pushes (server/listen.ts).
 */
export async function getTasks(
  deps: ApprovalDeps,
  agent_id: string,
  ids: readonly string[],
): Promise<TaskView[]> {
  const wanted = ids.filter(isUuid);
  if (wanted.length === 0) return [];
  const rows = await tasks.tasksOf(deps.knex, agent_id, wanted);
  return rows.map((raw) => taskView(parseJoined(deps, raw)));
}

/**
 * The agent's own tasks, newest first (tasks/list on 2025-11-25): a page of at most `limit`, after the
 * position `after` (the last one of the page before), and the position of the next page's start.
 */
export async function listTasks(
  deps: ApprovalDeps,
  agent_id: string,
  opts: { limit: number; after?: { t: string; id: string } },
): Promise<{ items: TaskView[]; next: { t: string; id: string } | null }> {
  const rows = (await tasks.taskPage(deps.knex, agent_id, opts)).map((raw) => parseJoined(deps, raw));
  const page = rows.slice(0, opts.limit);
  const last = page.at(-1);
  return {
    items: page.map(taskView),
    next: rows.length > opts.limit && last ? { t: last.task.created_at, id: last.task.id } : null,
  };
}

/** What a task's request says of it while the task has no outcome of its own. */
function fromRequest({
  task,
  request,
}: TaskWithRequest): Pick<TaskView, 'status' | 'statusMessage' | 'error'> {
  const where = request.review_url
    ? `a chair reviews it at ${request.review_url}`
    : `a chair decides it with: countersign approvals approve ${request.id} --as <chair>`;
  switch (request.status) {
    case 'pending':
      return { status: 'working', statusMessage: `Waiting for approval: ${where}` };
    case 'approved':
    case 'executing':
    case 'succeeded':
    case 'failed':
      return { status: 'working', statusMessage: `Approved; the write is being executed (${task.tool})` };
    case 'rejected':
      return failed(`Rejected by the chair${request.note ? `: ${request.note}` : ''}`, {
        code: 'APPROVAL_REQUIRED',
        reason: 'rejected',
        note: request.note,
        approval_request_id: request.id,
      });
    case 'expired':
      return failed('The approval request expired before the write was executed', {
        code: 'APPROVAL_REQUIRED',
        reason: 'expired',
        approval_request_id: request.id,
      });
    case 'unknown':
      return failed(
        'The write started and whether it was made is not known: it is not retried; a person settles it',
        { code: 'OUTCOME_UNKNOWN', reason: 'outcome_unknown', approval_request_id: request.id },
      );
  }
}

const failed = (message: string, data: Record<string, unknown>) => ({
  status: 'failed' as const,
  statusMessage: message,
  error: { code: TASK_FAILED, message, data },
});

function taskView(joined: TaskWithRequest): TaskView {
  const { task, request } = joined;
  const own = task.status !== 'working' ? ownOutcome(task) : fromRequest(joined);
  const lastUpdated = [task.updated_at, request.decided_at]
    .filter((t) => t !== null)
    .sort()
    .at(-1)!;
  return {
    taskId: task.id,
    ...own,
    createdAt: task.created_at,
    lastUpdatedAt: lastUpdated,
    ttlMs: Math.max(0, new Date(request.expires_at).getTime() - new Date(task.created_at).getTime()),
    pollIntervalMs: TASK_POLL_INTERVAL_MS,
  };
}

/** A task's own outcome, recorded by the runner or by a cancel. */
function ownOutcome(task: TaskRow): Pick<TaskView, 'status' | 'statusMessage' | 'result' | 'error'> {
  if (task.status === 'completed') {
    return { status: 'completed', statusMessage: 'The write was executed', result: task.outcome ?? {} };
  }
  if (task.status === 'cancelled')
    return { status: 'cancelled', statusMessage: 'Cancelled: the request was withdrawn' };
  const error = (task.outcome ?? { code: TASK_FAILED, message: 'failed' }) as unknown as TaskError;
  return { status: 'failed', statusMessage: error.message, error };
}

/** A task the runner took to execute: its write, and the approval it executes with. */
export interface ClaimedTask {
  id: string;
  agent_id: string;
  tool: string;
  arguments: Record<string, unknown>;
  approval_request_id: string;
  approval_id: string;
}

/**
 * Claims working tasks whose request has been approved (or whose execution has ended without the task
 * hearing of it: a replica died in between), each by one replica: a claim older than `staleMs` is taken
 * again. Locked `skip locked`, so replicas polling at once claim different tasks.
 */
export async function claimRunnable(deps: ApprovalDeps, staleMs: number, limit = 20): Promise<ClaimedTask[]> {
  const now = new Date();
  const stale = new Date(now.getTime() - staleMs).toISOString();
  // One statement, no transaction of its own: an idle round costs one round trip.
  const rows = await tasks.claimTasks(deps.knex, { now: now.toISOString(), stale, limit });
  return rows.map((r) => ({
    id: r.id as string,
    agent_id: r.agent_id as string,
    tool: r.tool as string,
    arguments: Json.pipe(z.record(z.string(), z.unknown())).parse(r.arguments),
    approval_request_id: r.approval_request_id as string,
    approval_id: r.approval_id as string,
  }));
}

/**
 * When the next round can claim a task (ms since the epoch): now when one whose request is approved is
 * unclaimed, else when the oldest claim on one goes stale (its replica died, or is slow); undefined
 * when no task waits to run. What a runner sets its timer to while task changes reach it otherwise.
 */
export async function nextRunnableAt(deps: ApprovalDeps, staleMs: number): Promise<number | undefined> {
  const row = await tasks.runnableTasks(deps.knex, [...RUNNABLE]);
  if (!row || Number(row.runnable) === 0) return undefined;
  if (Number(row.unclaimed) > 0 || row.oldest === null) return Date.now();
  return new Date(row.oldest).getTime() + staleMs;
}

/** Where a claimed task's request stands after the runner's call. */
export async function requestStatusOf(
  deps: ApprovalDeps,
  id: string,
): Promise<RequestRow['status'] | undefined> {
  const row = await requests.statusOf(deps.knex, id);
  return row ? ApprovalStatus.parse(row.status) : undefined;
}

/** Drops the claim on a task still working (its request went back to pending): the next round may take it. */
export async function releaseTask(deps: ApprovalDeps, id: string): Promise<void> {
  await tasks.releaseClaim(deps.knex, id);
}

/** Gives a working task its outcome; false if it already had one (a cancel, another runner). */
export async function settleTask(
  deps: ApprovalDeps,
  id: string,
  outcome: { status: 'completed'; result: Record<string, unknown> } | { status: 'failed'; error: TaskError },
): Promise<boolean> {
  return tasks.settleTaskRow(deps.knex, id, {
    status: outcome.status,
    outcome: JSON.stringify(outcome.status === 'completed' ? outcome.result : outcome.error),
    updated_at: new Date().toISOString(),
  });
}

/** What tasks/cancel found. */
export type CancelOutcome =
  | { kind: 'not_found' }
  /** The write has started (or ended): a task past that point runs to its outcome. */
  | { kind: 'started'; view: TaskView }
  /** The task already had its outcome: nothing changed. */
  | { kind: 'terminal'; view: TaskView }
  | { kind: 'cancelled'; view: TaskView };

/**
 * Cancels the agent's own task while its write has not started: its request is withdrawn (expired
 * early, with an approval.withdrawn row and the chairs' expiry notices) and the task becomes
 * cancelled, in one transaction. The request's row lock orders it against an execution starting: the
 * one that takes it second finds the other's change.
 */
export async function cancelTask(deps: ApprovalDeps, agent_id: string, id: string): Promise<CancelOutcome> {
  if (!isUuid(id)) return { kind: 'not_found' };
  const found = await retryingTransaction(deps.knex, async (trx) => {
    const task = await tasks.lockTask(trx, agent_id, id);
    if (!task) return 'not_found' as const;
    if (task.status !== 'working') return 'terminal' as const;
    const request = await requests.loadRow(trx, { id: task.approval_request_id as string }, true);
    if (!request || !['pending', 'approved'].includes(request.status)) return 'started' as const;
    const notices = deliveriesFor(deps, 'expired', { ...request, status: 'expired' });
    await requests.expireRequests(trx, [request.id], notices);
    await tasks.cancelTaskRow(trx, id, new Date().toISOString());
    await deps.audit.appendIn(trx, {
      kind: 'approval.withdrawn',
      ...requestFacts(request, { from: request.status, task_id: id }),
    });
    return 'cancelled' as const;
  });
  if (found === 'not_found') return { kind: 'not_found' };
  const view = (await getTask(deps, agent_id, id))!;
  return { kind: found, view };
}
