import { ProtocolError, ProtocolErrorCode, type Server } from '@modelcontextprotocol/server';
import type { CallToolResult } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { TaskView } from '../approval/index.ts';
import { AppError } from '../core/errors.ts';
import type { Agent } from '../core/identity.ts';
import type { CallPipeline } from './call.ts';
import type { TaskWaits } from './task-waits.ts';

/*
 * MCP tasks for writes, on both revisions that have them. 2026-07-28: the Tasks extension
 * (io.modelcontextprotocol/tasks), declared in a request's _meta envelope; tasks/get and tasks/cancel.
 * 2025-11-25: core tasks, a tools/call with a `task` parameter; tasks/get, tasks/result, tasks/list
 * and tasks/cancel. Either way a write with dry_run false and no approval_id becomes a task (call.ts,
 * approval/gate.ts), and the task's state is read from the database at each request, so any replica
 * answers alike.
 */

export const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';
const CLIENT_CAPABILITIES = 'io.modelcontextprotocol/clientCapabilities';
const PROTOCOL_VERSION = 'io.modelcontextprotocol/protocolVersion';
const RELATED_TASK = 'io.modelcontextprotocol/related-task';

/**
 * What the server advertises: the extension (server/discover, 2026-07-28), and core tasks for tool
 * calls, with list and cancel (initialize, 2025-11-25).
 */
export const tasksCapability = {
  extensions: { [TASKS_EXTENSION]: {} },
  tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } },
};

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** Which tasks a tools/call asks for: the extension (2026-07-28), core tasks (2025-11-25), or none. */
export function taskAsk(envelope: unknown, params: unknown): 'extension' | 'core' | undefined {
  if (isObject(envelope)) {
    const capabilities = envelope[CLIENT_CAPABILITIES];
    const extensions = isObject(capabilities) ? capabilities.extensions : undefined;
    if (isObject(extensions) && isObject(extensions[TASKS_EXTENSION])) return 'extension';
  }
  return isObject(params) && isObject(params.task) ? 'core' : undefined;
}

/** Whether a request came on 2026-07-28 (its envelope names a protocol version). */
const modern = (envelope: unknown) => isObject(envelope) && typeof envelope[PROTOCOL_VERSION] === 'string';

/**
 * A task as tasks/get carries it on 2026-07-28: a completed task's result is the tool's result as a
 * tools/call would have answered it, `resultType: complete` included.
 */
export const taskWire = (view: TaskView) =>
  view.result ? { ...view, result: { ...view.result, resultType: 'complete' } } : { ...view };

/** A task as 2025-11-25 names its fields (ttl, pollInterval), without its result or error. */
export const taskCore = (view: Pick<TaskView, Exclude<keyof TaskView, 'result' | 'error'>>) => ({
  taskId: view.taskId,
  status: view.status,
  statusMessage: view.statusMessage,
  createdAt: view.createdAt,
  lastUpdatedAt: view.lastUpdatedAt,
  ttl: view.ttlMs,
  pollInterval: view.pollIntervalMs,
});

/**
 * The seam's CreateTaskResult (2026-07-28 shape, call.ts) as a 2025-11-25 client reads it: `task`
 * beside the empty content the SDK's tools/call result check asks for. A call asked as a core task
 * must be answered with a task or a JSON-RPC error (a plain tool result breaks the requester), so a
 * failure that made no task — a refused draft, a write a rule denies, the rate limit — is answered as
 * the error: -32602, `data.code` and `data.reason` the envelope's, `data.envelope` the whole envelope
 * (audited as the call, as ever). On 2026-07-28 the extension lets such a call answer at once, and it
 * does, with the envelope.
 */
export function asCoreTaskResult(result: CallToolResult): CallToolResult {
  const created = result as unknown as TaskView & { resultType?: string };
  if (created.resultType === 'task') {
    return { content: [], task: taskCore(created) } as unknown as CallToolResult;
  }
  if (!result.isError) return result;
  const envelope = result.structuredContent as
    { error?: { code?: string; message?: string; reason?: string | null; trace_id?: string } } | undefined;
  const error = envelope?.error;
  throw new ProtocolError(ProtocolErrorCode.InvalidParams, error?.message ?? 'The call failed', {
    code: error?.code ?? 'INTERNAL_ERROR',
    reason: error?.reason ?? null,
    trace_id: error?.trace_id,
    envelope,
  });
}

const TaskIdParams = z.object({ taskId: z.string().max(200) }).passthrough();
const ListParams = z.object({ cursor: z.string().optional() }).passthrough();

/**
 * An unknown id and another agent's task are answered alike, so that no agent learns of another's
 * tasks: -32602 with data.code TARGET_NOT_FOUND.
 */
const notFound = (taskId: string) =>
  new ProtocolError(ProtocolErrorCode.InvalidParams, `Task not found: ${taskId.slice(0, 200)}`, {
    code: 'TARGET_NOT_FOUND',
  });

/**
 * On 2026-07-28 the tasks methods are the extension's: a request whose envelope does not declare it is
 * refused with -32021, naming the capability it lacks (2025-11-25 requests have no envelope: core tasks).
 */
function requireExtension(envelope: unknown): void {
  if (!modern(envelope) || taskAsk(envelope, undefined) === 'extension') return;
  throw new ProtocolError(
    ProtocolErrorCode.MissingRequiredClientCapability,
    `Declare the ${TASKS_EXTENSION} extension in this request's client capabilities to use tasks`,
    { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } },
  );
}

/** How long tasks/result waits for a working task before answering that it still is. */
const RESULT_WAIT_MS = 30_000;

type Tasks = Pick<CallPipeline, 'tasks'>['tasks'];

/**
 * Registers the tasks methods on `server`; `agentOf` authenticates each request. `waits` is what a
 * tasks/result wait waits on (task-waits.ts); without it (stdio) it reads again each poll interval.
 */
export function handleTasks(
  server: Server,
  pipeline: Pick<CallPipeline, 'tasks'>,
  agentOf: () => Promise<Agent>,
  waits?: TaskWaits,
) {
  const { tasks } = pipeline;
  server.setRequestHandler('tasks/get', { params: TaskIdParams }, async ({ taskId }, ctx) => {
    requireExtension(ctx.mcpReq.envelope);
    const view = await tasks.get(await agentOf(), taskId);
    if (!view) throw notFound(taskId);
    return modern(ctx.mcpReq.envelope) ? taskWire(view) : taskCore(view);
  });
  server.setRequestHandler('tasks/cancel', { params: TaskIdParams }, async ({ taskId }, ctx) => {
    requireExtension(ctx.mcpReq.envelope);
    const view = await cancel(tasks, await agentOf(), taskId);
    return modern(ctx.mcpReq.envelope) ? {} : taskCore(view);
  });
  server.setRequestHandler('tasks/list', { params: ListParams }, async ({ cursor }) => {
    const page = await tasks.list(await agentOf(), cursor).catch((err: unknown) => {
      // A cursor altered, or issued for another agent's list.
      if (err instanceof AppError)
        throw new ProtocolError(ProtocolErrorCode.InvalidParams, err.message, {
          code: err.code,
          reason: err.reason,
        });
      throw err;
    });
    return { tasks: page.items.map(taskCore), ...(page.next_cursor ? { nextCursor: page.next_cursor } : {}) };
  });
  // countersign's tasks never ask the client for input, so there is nothing to update; a task id is
  // answered as tasks/get would answer its owner (not found for anyone else's).
  server.setRequestHandler('tasks/update', { params: TaskIdParams }, async ({ taskId }, ctx) => {
    requireExtension(ctx.mcpReq.envelope);
    if (!(await tasks.get(await agentOf(), taskId))) throw notFound(taskId);
    throw new ProtocolError(ProtocolErrorCode.InvalidParams, 'This task asks for no input', {
      code: 'INVALID_ARGUMENT',
      reason: 'no_input_requested',
    });
  });
  server.setRequestHandler('tasks/result', { params: TaskIdParams }, async ({ taskId }, ctx) =>
    result(tasks, await agentOf(), taskId, ctx.mcpReq.signal, waits),
  );
}

/** tasks/cancel: the cancelled task, or why it cannot be cancelled. */
async function cancel(tasks: Tasks, agent: Agent, taskId: string): Promise<TaskView> {
  const done = await tasks.cancel(agent, taskId);
  if (done.kind === 'not_found') throw notFound(taskId);
  if (done.kind === 'cancelled' || done.view.status === 'cancelled') return done.view;
  const reason = done.kind === 'started' ? 'write_started' : 'terminal';
  const message =
    done.kind === 'started'
      ? 'This task cannot be cancelled: its write has started'
      : `This task is already ${done.view.status}`;
  throw new ProtocolError(ProtocolErrorCode.InvalidParams, message, {
    code: 'TASK_NOT_CANCELLABLE',
    reason,
    status: done.view.status,
  });
}

/**
 * tasks/result (2025-11-25): the tool's result once the task has one, waiting while it works (a
 * stateless wait: the database is read again when the task is announced changed, task-waits.ts); a
 * failed task's error as the JSON-RPC error, a cancelled one as -32602. Over HTTP the wait holds one
 * of the agent's turns (http.max_calls_in_flight_per_agent), as a call does.
 */
async function result(tasks: Tasks, agent: Agent, taskId: string, signal: AbortSignal, waits?: TaskWaits) {
  const until = Date.now() + RESULT_WAIT_MS;
  for (;;) {
    const view = await tasks.get(agent, taskId);
    if (!view) throw notFound(taskId);
    const related = { _meta: { [RELATED_TASK]: { taskId } } };
    if (view.status === 'completed') return { ...view.result, ...related };
    if (view.status === 'failed' && view.error) {
      throw new ProtocolError(view.error.code, view.error.message, view.error.data);
    }
    if (view.status === 'cancelled') {
      throw new ProtocolError(ProtocolErrorCode.InvalidParams, 'This task was cancelled', {
        code: 'TASK_CANCELLED',
      });
    }
    if (Date.now() > until || signal.aborted) {
      throw new ProtocolError(ProtocolErrorCode.InvalidRequest, 'This task is still working: ask again', {
        code: 'TASK_WORKING',
        status: view.status,
        poll_interval_ms: view.pollIntervalMs,
      });
    }
    if (waits) await waits.next(taskId, until - Date.now(), signal);
    else await new Promise((r) => setTimeout(r, view.pollIntervalMs));
  }
}
