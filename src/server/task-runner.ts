import type { CallToolResult } from '@modelcontextprotocol/server';
import type { Approvals, ClaimedTask, TaskError } from '../approval/index.ts';
import { TASK_FAILED } from '../approval/index.ts';
import type { Agent } from '../core/identity.ts';
import type { Logger } from '../log.ts';
import { retryable } from './answer.ts';
import type { CallPipeline } from './call.ts';

/*
 * Executes approved tasks: on every replica, a round claims the working tasks whose request is approved
 * (each claimed by one replica, `skip locked`) and makes, for each, the real call the agent would have
 * made — its arguments, dry_run false, the approval_id, and an idempotency key — through the call seam,
 * so the write takes the same gate as an agent's own execution: one approval, one write, write.started
 * then its outcome, each row saying `origin: task`. A replica that dies mid-way leaves its claim to go
 * stale; a later round's call with the same idempotency key returns the stored outcome, never a
 * second write, and an outcome reconciliation could not settle fails the task (OUTCOME_UNKNOWN).
 */

/** How many tasks a round claims at most. */
const CLAIM_BATCH = 20;

/** Errors after which the call may be tried again by a later round: nothing started. */
const TRANSIENT = new Set(['RATE_LIMITED', 'SOURCE_UNAVAILABLE', 'TIMEOUT', 'IDEMPOTENCY_CONFLICT']);

export interface TaskRunnerDeps {
  approvals: Pick<Approvals, 'tasks'>;
  pipeline: Pick<CallPipeline, 'call'>;
  /** The agent a task belongs to; undefined once it is revoked. */
  agentOf(id: string): Promise<Agent | undefined>;
  log: Logger;
  /** How often a round looks for approved tasks while changes made elsewhere are not announced. */
  interval_ms: number;
  /** A claim older than this is another replica's that died: taken again. */
  stale_ms: number;
  /**
   * Whether every change that makes a task runnable reaches `poke` (this process's decisions, and on
   * PostgreSQL the task announcements while the listening connection is up). While it does, rounds run
   * on pokes, when the oldest claim goes stale, and every `safety_ms`; while not, every `interval_ms`.
   */
  announced(): boolean;
  /** The longest a replica goes without a round while changes are announced. */
  safety_ms: number;
}

export interface TaskRunner {
  /** Runs a round now (after a decision on this replica), unless one is running. */
  poke(): void;
  close(): Promise<void>;
}

/** The key a task's write executes with: the agent's own, or one naming the task's request. */
const keyOf = (task: ClaimedTask) =>
  typeof task.arguments.idempotency_key === 'string'
    ? task.arguments.idempotency_key
    : `task:${task.approval_request_id}`;

/** The envelope's error code of a tool result, if it failed. */
const errorOf = (result: CallToolResult) => {
  const error = (
    result.structuredContent as { error?: { code?: string; message?: string; reason?: string } } | undefined
  )?.error;
  return result.isError
    ? { code: error?.code ?? 'INTERNAL_ERROR', message: error?.message ?? '', reason: error?.reason }
    : undefined;
};

/**
 * Runs one claimed task's write and gives the task its outcome, or leaves it for a later round; true
 * when that round should come at once (the task was released, approved again).
 */
async function runTask(deps: TaskRunnerDeps, task: ClaimedTask, signal: AbortSignal): Promise<boolean> {
  const { tasks } = deps.approvals;
  const agent = await deps.agentOf(task.agent_id);
  if (!agent) {
    const error: TaskError = {
      code: TASK_FAILED,
      message: 'The agent of this task has been revoked: its write is not executed',
      data: { code: 'NOT_LOGGED_IN', reason: 'agent_revoked' },
    };
    await tasks.settle(task.id, { status: 'failed', error });
    return false;
  }
  const args = {
    ...task.arguments,
    dry_run: false,
    approval_id: task.approval_id,
    idempotency_key: keyOf(task),
  };
  let result: CallToolResult;
  try {
    result = await deps.pipeline.call(agent, task.tool, args, signal, undefined, { task_id: task.id });
  } catch (err) {
    // A protocol error (the database away, the tool gone for now): the next round calls again with the
    // same key — a retry when nothing had started, else a replay of the outcome (server/answer.ts).
    const retry = retryable(err);
    deps.log.warn({ err, task_id: task.id, retry }, 'task execution call failed; a later round calls again');
    return false;
  }
  const status = await tasks.requestStatus(task.approval_request_id);
  const failure = errorOf(result);
  if ((status === 'succeeded' || status === 'failed') && failure?.code === 'APPROVAL_REQUIRED') {
    // The agent executed the approval itself, with its approval_id, before the runner came to it.
    const message = 'The approval was used by a call outside this task: see its outcome with get_approval';
    const error = { code: TASK_FAILED, message, data: { code: 'APPROVAL_REQUIRED', reason: 'consumed' } };
    await tasks.settle(task.id, { status: 'failed', error });
  } else if (status === 'succeeded' || status === 'failed') {
    // The write's outcome, as the agent's own call would have answered it (a replay after a crash).
    await tasks.settle(task.id, { status: 'completed', result: result as Record<string, unknown> });
  } else if (status === 'pending' || (status === 'approved' && failure?.reason === 'policy_changed')) {
    // Sent back for more approvals (a policy made stricter since the approval): the task waits with
    // its request, and the next approval's round takes it at once rather than once this claim is stale;
    // or approved again at once by the approvals it kept, under a new approval_id the next round runs.
    await tasks.release(task.id);
    return status === 'approved';
  } else if (status === 'approved' && failure && !TRANSIENT.has(failure.code)) {
    // Refused before it started, for good (a binding the approval no longer matches, a disabled approver).
    const error = { code: TASK_FAILED, message: failure.message, data: { ...failure } };
    await tasks.settle(task.id, { status: 'failed', error });
  }
  // Otherwise it is still executing (reconciliation settles it), refused for now, or was rejected,
  // expired or settled as unknown meanwhile (the task reads those from its request): its claim is
  // left to go stale, and a later round, on any replica, calls again with the same key.
  return false;
}

/** Starts the rounds; `close` stops them and waits for the round under way. */
export function startTaskRunner(deps: TaskRunnerDeps): TaskRunner {
  const abort = new AbortController();
  let running: Promise<void> | undefined;
  let again = false;
  let timer: NodeJS.Timeout | undefined;
  const round = async () => {
    do {
      again = false;
      const claimed = await deps.approvals.tasks.claim(deps.stale_ms, CLAIM_BATCH);
      for (const task of claimed) {
        if (abort.signal.aborted) return;
        const soon = await runTask(deps, task, abort.signal).catch((err: unknown) => {
          deps.log.error({ err, task_id: task.id }, 'task execution failed; will retry');
          return false;
        });
        again ||= soon;
      }
      // A full batch: there may be more.
      again ||= claimed.length === CLAIM_BATCH;
    } while (again && !abort.signal.aborted);
  };
  /** After a round: the next one when the oldest claim goes stale, or after the fallback wait. */
  const schedule = async (failed: boolean) => {
    let wait = deps.announced() && !failed ? deps.safety_ms : deps.interval_ms;
    if (!failed) {
      const due = await deps.approvals.tasks
        .nextDue(deps.stale_ms)
        .catch(() => Date.now() + deps.interval_ms);
      if (due !== undefined) wait = Math.min(wait, Math.max(0, due - Date.now()));
    }
    if (abort.signal.aborted || running) return;
    clearTimeout(timer);
    timer = setTimeout(poke, wait);
    timer.unref();
  };
  const poke = () => {
    if (abort.signal.aborted) return;
    if (running) {
      again = true;
      return;
    }
    clearTimeout(timer);
    let failed = false;
    running = round()
      .catch((err: unknown) => {
        failed = true;
        deps.log.warn({ err }, 'task round failed');
      })
      .finally(() => {
        running = undefined;
        void schedule(failed);
      });
  };
  // The first round at once: claims a replica left behind when it died are taken when they go stale.
  poke();
  return {
    poke,
    async close() {
      abort.abort();
      clearTimeout(timer);
      await running;
    },
  };
}
