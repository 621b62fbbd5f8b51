import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import type { Knex } from 'knex';
import type { Client } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';
import { childEnv } from './built.ts';
import { ROOT } from './server.ts';

/** The framing the Tasks requester puts on its 2026-07-28 requests. */
export const FRAMING = {
  protocolVersion: '2026-07-28',
  clientInfo: { name: 'countersign-test', version: '1.0.0' },
  clientCapabilities: {},
};

type JsonRpcAnswer =
  | { kind: 'result'; result: Record<string, unknown> }
  | { kind: 'error'; error: { code: number; message: string; data?: unknown } };

/** The body of an answer: one JSON object, or the last data line of an event stream. */
async function answerOf(res: Response): Promise<Record<string, unknown>> {
  const text = await res.text();
  if (!(res.headers.get('content-type') ?? '').includes('text/event-stream')) return JSON.parse(text);
  const data = text
    .split('\n')
    .filter((l) => l.startsWith('data:'))
    .map((l) => l.slice(5).trim())
    .filter((l) => l.length > 0);
  return JSON.parse(data.at(-1)!);
}

let nextId = 1;

/**
 * One 2026-07-28 request POSTed to /mcp with the standard headers (Mcp-Method, and Mcp-Name for the
 * methods whose body names a tool or a task): what a requester's raw dispatch sends.
 */
export async function rawRequest(
  url: string,
  token: string,
  request: unknown,
  version = FRAMING.protocolVersion,
): Promise<JsonRpcAnswer> {
  const { method, params } = request as { method: string; params?: Record<string, unknown> };
  const name =
    method === 'tools/call' ? params?.name : method.startsWith('tasks/') ? params?.taskId : undefined;
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${token}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'MCP-Protocol-Version': version,
      'Mcp-Method': method,
      ...(typeof name === 'string' ? { 'Mcp-Name': name } : {}),
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: nextId++, ...(request as object) }),
  });
  const body = await answerOf(res);
  if ('error' in body) return { kind: 'error', error: body.error as { code: number; message: string } };
  return { kind: 'result', result: body.result as Record<string, unknown> };
}

/** A 2026-07-28 request as the Tasks requester frames it (its metadata envelope with the extension). */
export const framed = (method: string, params: Record<string, unknown>, tasks = true) => ({
  method,
  params: {
    ...params,
    _meta: {
      'io.modelcontextprotocol/protocolVersion': FRAMING.protocolVersion,
      'io.modelcontextprotocol/clientInfo': FRAMING.clientInfo,
      'io.modelcontextprotocol/clientCapabilities': tasks
        ? { extensions: { 'io.modelcontextprotocol/tasks': {} } }
        : {},
    },
  },
});
/** A write of `tool` asked once as a task (dry_run false, the extension declared): its CreateTaskResult. */
export async function askAsTask(url: string, token: string, tool: string, args: Record<string, unknown>) {
  const answer = await rawRequest(
    url,
    token,
    framed('tools/call', { name: tool, arguments: { ...args, dry_run: false } }),
  );
  assert.equal(answer.kind, 'result', JSON.stringify(answer));
  return (answer as { result: Record<string, unknown> }).result;
}

/** The official Tasks requester on a connected 2026-07-28 client, dispatching over HTTP with `token`. */
export function taskSession(client: Client, url: string, token: string) {
  return createTaskSessionFromClient(client, {
    endpointId: `countersign-${url}`,
    rawDispatch: (request) => rawRequest(url, token, request) as never,
    v2RequestFraming: FRAMING,
  });
}

/** The README's task example, run as it tells a user to: `node --import tsx examples/send-as-task.ts REVISION`. */
export const TASK_EXAMPLE = ['--import', 'tsx', 'examples/send-as-task.ts'] as const;

/**
 * examples/send-as-task.ts as a child process through tsx, in the checkout at `root` (this one, or the
 * README walk's fresh copy of it), asking a message with `text` on `revision`.
 */
export function runTaskExample(env: Record<string, string>, revision: string, text: string, root = ROOT) {
  const [, , example] = TASK_EXAMPLE;
  const child = spawn(
    process.execPath,
    [...TASK_EXAMPLE.slice(0, 2), path.join(root, example), revision, text],
    {
      cwd: root,
      env: childEnv(env),
    },
  );
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const exit = new Promise<number | null>((resolve) => child.once('exit', resolve));
  return { exit, stdout: () => stdout, stderr: () => stderr, kill: () => child.kill('SIGKILL') };
}

/** How many outgoing messages carry exactly `text`: what a task's write sent, counted in the store. */
export async function sentCount(knex: Knex, text: string): Promise<number> {
  const row = (await knex('messages')
    .where({ direction: 'outgoing', content_text: text })
    .count({ n: '*' })
    .first()) as { n?: unknown } | undefined;
  return Number(row?.n);
}

/** A JSON-RPC message read off a listen stream. */
export type StreamMessage = {
  method?: string;
  id?: unknown;
  params?: Record<string, unknown>;
  result?: Record<string, unknown>;
  error?: { code: number; message: string };
};

/**
 * A 2026-07-28 subscriptions/listen POSTed with `filter`, its event stream read as it comes: `next`
 * waits for the first message after the ones already taken that `accepts`, `ended` for the stream's end.
 */
export async function openListen(
  url: string,
  token: string,
  filter: Record<string, unknown>,
  id: string | number = 'listen-1',
) {
  const abort = new AbortController();
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    signal: abort.signal,
    headers: {
      Authorization: `Bearer ${token}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'MCP-Protocol-Version': FRAMING.protocolVersion,
      'Mcp-Method': 'subscriptions/listen',
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id,
      ...framed('subscriptions/listen', { notifications: filter }),
    }),
  });
  const messages: StreamMessage[] = [];
  const waiters = new Set<() => void>();
  let done = false;
  const wake = () => waiters.forEach((w) => w());
  const reading = (async () => {
    if (!res.body) return;
    if (!(res.headers.get('content-type') ?? '').includes('text/event-stream')) {
      const text = await res.text().catch(() => '');
      if (text) messages.push(JSON.parse(text) as StreamMessage);
      done = true;
      wake();
      return;
    }
    const decoder = new TextDecoder();
    let buffer = '';
    try {
      for await (const chunk of res.body) {
        buffer += decoder.decode(chunk as Uint8Array, { stream: true });
        for (let cut = buffer.indexOf('\n\n'); cut !== -1; cut = buffer.indexOf('\n\n')) {
          const event = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = event
            .split('\n')
            .filter((l) => l.startsWith('data:'))
            .map((l) => l.slice(5).trim())
            .join('');
          if (data) messages.push(JSON.parse(data) as StreamMessage);
        }
        wake();
      }
    } catch {
      // Aborted by close().
    } finally {
      done = true;
      wake();
    }
  })();
  let taken = 0;
  return {
    status: res.status,
    contentType: res.headers.get('content-type') ?? '',
    messages,
    /** The next message that `accepts` (the ones skipped on the way are taken too). */
    async next(
      what: string,
      accepts: (m: StreamMessage) => boolean,
      timeoutMs = 30_000,
    ): Promise<StreamMessage> {
      const until = Date.now() + timeoutMs;
      for (;;) {
        while (taken < messages.length) {
          const m = messages[taken++]!;
          if (accepts(m)) return m;
        }
        if (done) throw new Error(`the listen stream ended before ${what}`);
        if (Date.now() > until) throw new Error(`no ${what} on the listen stream within ${timeoutMs} ms`);
        await new Promise<void>((resolve) => {
          const w = () => {
            waiters.delete(w);
            resolve();
          };
          waiters.add(w);
          setTimeout(w, 200);
        });
      }
    },
    async ended(): Promise<void> {
      await reading;
    },
    async close(): Promise<void> {
      abort.abort();
      await reading;
    },
  };
}

/** A notifications/tasks message for `taskId` with `status`, as a listen stream carries it. */
export const taskNote = (taskId: string, status?: string) => (m: StreamMessage) =>
  m.method === 'notifications/tasks' &&
  m.params?.taskId === taskId &&
  (!status || m.params?.status === status);
