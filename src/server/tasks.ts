import { ProtocolError, ProtocolErrorCode, type Server } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { TaskView } from '../approval/index.ts';
import type { Agent } from '../core/identity.ts';
import type { CallPipeline } from './call.ts';

/*
 * The MCP Tasks extension (io.modelcontextprotocol/tasks) on the 2026-07-28 revision: a client that
 * declares it on a tools/call of a write with dry_run false and no approval_id gets a task (call.ts,
 * approval/gate.ts); tasks/get and tasks/cancel, here, read and cancel the agent's own tasks from the
 * database, so any replica answers them alike.
 */

export const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';
const CLIENT_CAPABILITIES = 'io.modelcontextprotocol/clientCapabilities';

/** What server/discover advertises: the extension, with no settings of its own. */
export const tasksCapability = { extensions: { [TASKS_EXTENSION]: {} } };

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** Whether a request's envelope (ctx.mcpReq.envelope) declares the Tasks extension. */
export function declaresTasks(envelope: unknown): boolean {
  if (!isObject(envelope)) return false;
  const capabilities = envelope[CLIENT_CAPABILITIES];
  const extensions = isObject(capabilities) ? capabilities.extensions : undefined;
  return isObject(extensions) && isObject(extensions[TASKS_EXTENSION]);
}

const TaskIdParams = z.object({ taskId: z.string().max(200) }).passthrough();

/**
 * An unknown id and another agent's task are answered alike, so that no agent learns of another's
 * tasks: -32602 with data.code TARGET_NOT_FOUND.
 */
const notFound = (taskId: string) =>
  new ProtocolError(ProtocolErrorCode.InvalidParams, `Task not found: ${taskId.slice(0, 200)}`, {
    code: 'TARGET_NOT_FOUND',
  });

/**
 * A task as tasks/get carries it on 2026-07-28: a completed task's result is the tool's result as a
 * tools/call would have answered it, `resultType: complete` included.
 */
export const taskWire = (view: TaskView) =>
  view.result ? { ...view, result: { ...view.result, resultType: 'complete' } } : { ...view };

/** Registers tasks/get and tasks/cancel on `server`; `agentOf` authenticates each request. */
export function handleTasks(
  server: Server,
  pipeline: Pick<CallPipeline, 'tasks'>,
  agentOf: () => Promise<Agent>,
): void {
  server.setRequestHandler('tasks/get', { params: TaskIdParams }, async ({ taskId }) => {
    const view = await pipeline.tasks.get(await agentOf(), taskId);
    if (!view) throw notFound(taskId);
    return taskWire(view);
  });
  server.setRequestHandler('tasks/cancel', { params: TaskIdParams }, async ({ taskId }) => {
    const done = await pipeline.tasks.cancel(await agentOf(), taskId);
    if (done.kind === 'not_found') throw notFound(taskId);
    if (done.kind === 'started') {
      throw new ProtocolError(
        ProtocolErrorCode.InvalidParams,
        'This task cannot be cancelled: its write has started',
        { code: 'TASK_NOT_CANCELLABLE', reason: 'write_started', status: done.view.status },
      );
    }
    if (done.kind === 'terminal' && done.view.status !== 'cancelled') {
      throw new ProtocolError(ProtocolErrorCode.InvalidParams, `This task is already ${done.view.status}`, {
        code: 'TASK_NOT_CANCELLABLE',
        reason: 'terminal',
        status: done.view.status,
      });
    }
    return {};
  });
}
