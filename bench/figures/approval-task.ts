import { median, percentile } from '../lib/stats.ts';
import type { ChairSession } from '../lib/web.ts';

/*
 * The (e) round trip asked once as an MCP task (2026-07-28 Tasks extension): the agent's tools/call
 * creates the task, the chair approves in the review form, and the agent polls tasks/get until the task
 * is completed, or (pushed) waits on a subscriptions/listen stream naming the task for the
 * notifications/tasks that says so — measured from the client, as an agent waiting on the task sees it.
 */

export const TASK_STEPS = ['create', 'approve', 'completed'] as const;
export type TaskSteps = Record<(typeof TASK_STEPS)[number], number>;

/** How often the bench's client asks tasks/get (the server advises 1000 ms; a client may ask sooner). */
export const TASK_POLL_MS = 5;

let nextId = 1;

/** One 2026-07-28 request with the Tasks extension declared in its envelope; its result, or a throw. */
async function rpc(url: string, token: string, method: string, params: Record<string, unknown>) {
  const name = method === 'tools/call' ? params.name : params.taskId;
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${token}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'MCP-Protocol-Version': '2026-07-28',
      'Mcp-Method': method,
      ...(typeof name === 'string' ? { 'Mcp-Name': name } : {}),
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: nextId++,
      method,
      params: {
        ...params,
        _meta: {
          'io.modelcontextprotocol/protocolVersion': '2026-07-28',
          'io.modelcontextprotocol/clientInfo': { name: 'countersign-bench', version: '1' },
          'io.modelcontextprotocol/clientCapabilities': {
            extensions: { 'io.modelcontextprotocol/tasks': {} },
          },
        },
      },
    }),
  });
  const text = await res.text();
  const body = JSON.parse(
    text.startsWith('{')
      ? text
      : text
          .split('\n')
          .findLast((l) => l.startsWith('data:'))!
          .slice(5),
  ) as { result?: Record<string, unknown>; error?: unknown };
  if (!body.result) throw new Error(`${method} answered ${JSON.stringify(body.error)}`);
  return body.result;
}

/**
 * A subscriptions/listen naming `taskId`, read until the task's notifications/tasks says it is
 * completed: resolves then (and closes the stream), rejects if it says the task failed.
 */
async function pushedCompletion(url: string, token: string, taskId: string) {
  const abort = new AbortController();
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    signal: abort.signal,
    headers: {
      Authorization: `Bearer ${token}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'MCP-Protocol-Version': '2026-07-28',
      'Mcp-Method': 'subscriptions/listen',
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: `listen-${nextId++}`,
      method: 'subscriptions/listen',
      params: {
        notifications: { taskIds: [taskId] },
        _meta: {
          'io.modelcontextprotocol/protocolVersion': '2026-07-28',
          'io.modelcontextprotocol/clientInfo': { name: 'countersign-bench', version: '1' },
          'io.modelcontextprotocol/clientCapabilities': {
            extensions: { 'io.modelcontextprotocol/tasks': {} },
          },
        },
      },
    }),
  });
  const decoder = new TextDecoder();
  let buffer = '';
  let first = true;
  let markOpen = () => {};
  const opened = new Promise<undefined>((resolve) => (markOpen = () => resolve(undefined)));
  const done = (async () => {
    for await (const chunk of res.body!) {
      buffer += decoder.decode(chunk as Uint8Array, { stream: true });
      for (let cut = buffer.indexOf('\n\n'); cut !== -1; cut = buffer.indexOf('\n\n')) {
        const data = buffer
          .slice(0, cut)
          .split('\n')
          .find((l) => l.startsWith('data:'));
        buffer = buffer.slice(cut + 2);
        if (!data) continue;
        const note = JSON.parse(data.slice(5)) as {
          method?: string;
          params?: { taskId?: string; status?: string };
        };
        if (note.method !== 'notifications/tasks' || note.params?.taskId !== taskId) continue;
        if (first) markOpen();
        first = false;
        if (note.params.status === 'completed') return abort.abort();
        if (note.params.status !== 'working') throw new Error(`task ${note.params.status}`);
      }
    }
    throw new Error('the listen stream ended before the task completed');
  })().catch((err: unknown) => {
    if (!abort.signal.aborted) throw err;
  });
  // The stream is open (the task as it is pushed) before the chair decides.
  await Promise.race([opened, done]);
  return { completed: done };
}

/**
 * One write asked as a task, end to end; each step's milliseconds. `wait`: how the agent learns of
 * the completion — polling tasks/get every TASK_POLL_MS, or a listen stream the server pushes to.
 */
export async function taskCycle(
  i: number,
  url: string,
  token: string,
  chair: ChairSession,
  wait: 'poll' | 'push' = 'poll',
): Promise<TaskSteps> {
  const args = { target_type: 'contact', target_id: 'ct_david', content_text: `Bench task ${i} — נא לאשר` };
  const t = [performance.now()];
  const created = await rpc(url, token, 'tools/call', {
    name: 'isphere_send_message',
    arguments: { ...args, dry_run: false },
  });
  if (created.resultType !== 'task') throw new Error(`no task: ${JSON.stringify(created)}`);
  const requestId = /\/approvals\/([0-9a-f-]{36})/.exec(String(created.statusMessage))?.[1];
  if (!requestId) throw new Error(`no review link in ${String(created.statusMessage)}`);
  const pushed = wait === 'push' ? await pushedCompletion(url, token, String(created.taskId)) : undefined;
  t.push(performance.now());
  await chair.approve(requestId);
  t.push(performance.now());
  if (pushed) await pushed.completed;
  else
    for (;;) {
      const task = await rpc(url, token, 'tasks/get', { taskId: created.taskId });
      if (task.status === 'completed') break;
      if (task.status !== 'working') throw new Error(`task ${String(task.status)}: ${JSON.stringify(task)}`);
      await new Promise((r) => setTimeout(r, TASK_POLL_MS));
    }
  t.push(performance.now());
  return Object.fromEntries(TASK_STEPS.map((s, k) => [s, t[k + 1]! - t[k]!])) as TaskSteps;
}

/** `rounds` task cycles after a warm-up: the totals' p50 and p99 and each step's p50. */
export async function taskRounds(
  url: string,
  token: string,
  chair: ChairSession,
  rounds: number,
  from: number,
  wait: 'poll' | 'push' = 'poll',
) {
  const totals: number[] = [];
  const steps = { create: [] as number[], approve: [] as number[], completed: [] as number[] };
  const warmup = Math.min(10, Math.ceil(rounds / 5));
  for (let i = 0; i < warmup + rounds; i++) {
    const ms = await taskCycle(from + i, url, token, chair, wait);
    if (i < warmup) continue;
    totals.push(TASK_STEPS.reduce((sum, s) => sum + ms[s], 0));
    for (const s of TASK_STEPS) steps[s].push(ms[s]);
  }
  const breakdown = TASK_STEPS.map((s) => `${s} ${median(steps[s]).toFixed(1)}`).join(', ');
  return { p50: median(totals), p99: percentile(totals, 99), breakdown };
}
