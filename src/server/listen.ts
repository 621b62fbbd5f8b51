import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { SERVER_INFO_META_KEY, SUBSCRIPTION_ID_META_KEY } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { TaskView } from '../approval/index.ts';
import type { ClusterBus } from '../cluster/bus.ts';
import type { Agent } from '../core/identity.ts';
import type { Logger } from '../log.ts';
import type { CallPipeline } from './call.ts';
import { taskWire } from './tasks.ts';

/*
 * subscriptions/listen streams that watch tasks (2026-07-28, Tasks extension: `taskIds` in the
 * filter). The SDK's listen router knows only the four change types of the core filter and drops
 * `taskIds`, so a listen that names tasks is served here, whole: its acknowledgement says which of the
 * named tasks are watched (the agent's own; another agent's id is left out exactly like an unknown
 * one), each watched task's state is pushed at once as `notifications/tasks` and again whenever it
 * changes, and tool-list changes go out as the SDK's stream would send them. Any other listen is the
 * SDK's.
 *
 * A task changes on any replica (a decision, the runner, an expiry) or in the CLI: on PostgreSQL a
 * trigger announces it (ClusterBus.onTaskChanged) and the replica holding the stream reads the task
 * again; every poll interval the streams also read their working tasks, which is how changes reach
 * them on the embedded database and how a lost announcement is made up for.
 */

/** How many tasks one listen may watch. */
export const MAX_WATCHED_TASKS = 100;
/** How often a stream writes a comment, so that proxies keep it open. */
const KEEP_ALIVE_MS = 15_000;
/** While announcements arrive, how long a stream goes without reading its tasks anyway. */
const SAFETY_READ_MS = 10_000;
const HEADER_MISMATCH = -32020;

const ListenFilter = z
  .object({
    toolsListChanged: z.boolean().optional(),
    promptsListChanged: z.boolean().optional(),
    resourcesListChanged: z.boolean().optional(),
    resourceSubscriptions: z.array(z.string()).optional(),
    taskIds: z.array(z.string().max(200)).max(MAX_WATCHED_TASKS),
  })
  .passthrough();

const ListenRequest = z.object({
  jsonrpc: z.literal('2.0'),
  id: z.union([z.string().max(200), z.number()]),
  method: z.literal('subscriptions/listen'),
  params: z.object({ notifications: ListenFilter }).passthrough(),
});

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** Whether a request body is one subscriptions/listen whose filter names tasks: served here. */
export function watchesTasks(body: unknown): boolean {
  if (!isObject(body) || body.method !== 'subscriptions/listen' || !isObject(body.params)) return false;
  const filter = body.params.notifications;
  return isObject(filter) && Object.hasOwn(filter, 'taskIds');
}

/** One open stream that watches tasks. */
interface Watch {
  agent: Agent;
  /** The watched tasks still working, and what was last pushed of each (status and message). */
  pushed: Map<string, string>;
  push(view: TaskView): void;
  lastRead: number;
  reading: boolean;
  again: boolean;
}

export interface TaskListenDeps {
  tasks: Pick<CallPipeline['tasks'], 'getMany'>;
  bus: ClusterBus;
  log: Logger;
  /** How often the streams read their working tasks when no announcement says they changed. */
  poll_ms: number;
  serverInfo: { name: string; version: string };
}

export interface TaskListen {
  /** Answers one listen request that watchesTasks (the caller authenticated `agent`). */
  serve(agent: Agent, body: unknown, headers: IncomingHttpHeaders, res: ServerResponse): Promise<void>;
  /** Ends every stream gracefully (the empty listen result), then stops. */
  close(): void;
}

const signature = (view: TaskView) => `${view.status}\n${view.statusMessage}`;

/** A JSON-RPC error answer to the listen request itself, before any stream. */
function refuse(res: ServerResponse, status: number, id: unknown, code: number, message: string) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', id: id ?? null, error: { code, message } }));
}

/** Reads the watch's working tasks and pushes each that changed; a terminal one is watched no more. */
async function read(deps: TaskListenDeps, watches: Set<Watch>, watch: Watch): Promise<void> {
  if (watch.reading) {
    watch.again = true;
    return;
  }
  watch.reading = true;
  try {
    do {
      watch.again = false;
      watch.lastRead = Date.now();
      const asked = [...watch.pushed.keys()];
      const views = await deps.tasks.getMany(watch.agent, asked);
      // A task purged with its request meanwhile: nothing more will change.
      const found = new Set(views.map((v) => v.taskId));
      for (const id of asked) if (!found.has(id)) watch.pushed.delete(id);
      for (const view of views) {
        if (!watches.has(watch)) return;
        if (watch.pushed.get(view.taskId) !== signature(view)) watch.push(view);
        if (view.status === 'working') watch.pushed.set(view.taskId, signature(view));
        else watch.pushed.delete(view.taskId);
      }
    } while (watch.again && watches.has(watch));
  } catch (err) {
    // The database away: the next announcement or poll reads again.
    deps.log.warn({ err, agent_id: watch.agent.id }, 'could not read the tasks a listen stream watches');
  } finally {
    watch.reading = false;
  }
}

/** An SSE stream answering one listen request: its notifications stamped with the subscription id. */
function openStream(
  res: ServerResponse,
  subscriptionId: string | number,
  serverInfo: TaskListenDeps['serverInfo'],
) {
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache, no-transform',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  const open = () => !res.writableEnded && !res.destroyed;
  const frame = (message: unknown) => {
    if (open()) res.write(`event: message\ndata: ${JSON.stringify(message)}\n\n`);
  };
  const keepAlive = setInterval(() => {
    if (open()) res.write(': keepalive\n\n');
  }, KEEP_ALIVE_MS);
  keepAlive.unref();
  return {
    notify(method: string, params: Record<string, unknown>) {
      const meta = isObject(params._meta) ? params._meta : {};
      frame({
        jsonrpc: '2.0',
        method,
        params: { ...params, _meta: { ...meta, [SUBSCRIPTION_ID_META_KEY]: subscriptionId } },
      });
    },
    stop: () => clearInterval(keepAlive),
    /** Graceful: the empty listen result says the server ended the subscription on purpose. */
    end() {
      clearInterval(keepAlive);
      frame({
        jsonrpc: '2.0',
        id: subscriptionId,
        result: {
          resultType: 'complete',
          _meta: { [SUBSCRIPTION_ID_META_KEY]: subscriptionId, [SERVER_INFO_META_KEY]: serverInfo },
        },
      });
      res.end();
    },
  };
}

/** What a listen asked for that is honored: tool-list changes (advertised), and the agent's own tasks. */
function honoredOf(requested: z.output<typeof ListenFilter>, own: readonly string[]) {
  return {
    ...(requested.toolsListChanged === true ? { toolsListChanged: true as const } : {}),
    ...(own.length > 0 ? { taskIds: [...own] } : {}),
  };
}

/**
 * Reads a stream's tasks again when an announcement names one (or says some may be missed), and
 * every poll interval when announcements do not arrive (or have not for a while). The poll runs only
 * while a stream is open: a server nobody listens to is not woken each interval. Returns `watching`,
 * called when a stream opens, and the stop.
 */
function watchChanges(deps: TaskListenDeps, watches: Set<Watch>) {
  const unannounce = deps.bus.onTaskChanged((taskId) => {
    for (const watch of watches)
      if (taskId === '*' || watch.pushed.has(taskId)) void read(deps, watches, watch);
  });
  let timer: NodeJS.Timeout | undefined;
  const poll = () => {
    if (watches.size === 0) {
      clearInterval(timer);
      timer = undefined;
      return;
    }
    const announced = deps.bus.listening();
    for (const watch of watches) {
      if (watch.pushed.size === 0) continue;
      if (!announced || Date.now() - watch.lastRead >= SAFETY_READ_MS) void read(deps, watches, watch);
    }
  };
  return {
    watching() {
      if (timer) return;
      timer = setInterval(poll, deps.poll_ms);
      timer.unref();
    },
    stop() {
      unannounce();
      clearInterval(timer);
    },
  };
}

export function createTaskListen(deps: TaskListenDeps): TaskListen {
  const watches = new Set<Watch>();
  const enders = new Set<() => void>();

  const watching = watchChanges(deps, watches);

  return {
    async serve(agent, body, headers, res) {
      const parsed = ListenRequest.safeParse(body);
      const id = isObject(body) ? body.id : null;
      if (!parsed.success) {
        return refuse(res, 200, id, -32602, `Invalid params: ${z.prettifyError(parsed.error).slice(0, 500)}`);
      }
      const method = headers['mcp-method'];
      if (method !== undefined && method !== 'subscriptions/listen') {
        return refuse(
          res,
          400,
          id,
          HEADER_MISMATCH,
          'The Mcp-Method header does not match the body: subscriptions/listen',
        );
      }
      const { id: subscriptionId, params } = parsed.data;
      const wanted = [...new Set(params.notifications.taskIds)];
      const own = new Map((await deps.tasks.getMany(agent, wanted)).map((v) => [v.taskId, v]));
      const honored = honoredOf(
        params.notifications,
        wanted.filter((t) => own.has(t)),
      );
      const stream = openStream(res, subscriptionId, deps.serverInfo);
      stream.notify('notifications/subscriptions/acknowledged', { notifications: honored });
      if (Object.keys(honored).length === 0) return stream.end();

      const watch: Watch = {
        agent,
        pushed: new Map(),
        push: (view) => stream.notify('notifications/tasks', taskWire(view)),
        lastRead: Date.now(),
        reading: false,
        again: false,
      };
      const unlisten = honored.toolsListChanged
        ? deps.bus.subscribe((event) => {
            if (event.kind === 'tools_list_changed') stream.notify('notifications/tools/list_changed', {});
          })
        : () => undefined;
      const teardown = () => {
        watches.delete(watch);
        enders.delete(end);
        unlisten();
        stream.stop();
      };
      const end = () => {
        teardown();
        stream.end();
      };
      res.once('close', teardown);
      enders.add(end);
      watches.add(watch);
      watching.watching();
      // Each watched task as it is now: a change made before the stream opened is not missed.
      for (const taskId of honored.taskIds ?? []) {
        const view = own.get(taskId)!;
        watch.push(view);
        if (view.status === 'working') watch.pushed.set(taskId, signature(view));
      }
    },
    close() {
      watching.stop();
      for (const end of [...enders]) end();
    },
  };
}
