/**
 * A Tasks client for countersign in a few lines, on either protocol revision.
 *
 * `@modelcontextprotocol/ext-tasks` asks a task-augmented `tools/call` and waits for its outcome. On
 * 2025-11-25 it needs only a connected SDK `Client`. On 2026-07-28 it sends its requests itself, and
 * needs two things the SDK `Client` does not give it: a `rawDispatch` (one POST to /mcp per request,
 * with the `Mcp-Method` and `Mcp-Name` headers the revision requires) and the `_meta` framing it puts
 * on each request (protocol version, client info and capabilities). This file supplies both:
 *
 * ```ts
 * const tasks = await openTaskClient(url, token, '2026-07-28'); // or '2025-11-25'
 * const execution = await tasks.callTool('isphere_send_message', { ...args, dry_run: false });
 * // a chair approves it in the web form (the task's statusMessage has the link)
 * const result = await tasks.result(execution);
 * await tasks.close();
 * ```
 */
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import {
  createTaskSessionFromClient,
  resultFromTaskOutcome,
  type JsonRpcResponse,
  type ToolExecution,
} from '@modelcontextprotocol/ext-tasks/client';

/** What the requester takes as a tool's arguments: JSON values. */
type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

export type Revision = '2026-07-28' | '2025-11-25';

const CLIENT_INFO = { name: 'countersign-task-client', version: '1.0.0' };

/** The body of an answer to request `id`: one JSON object, or the matching message of an event stream. */
async function answerTo(res: Response, id: number): Promise<Record<string, unknown>> {
  const text = await res.text();
  if (!(res.headers.get('content-type') ?? '').includes('text/event-stream')) return JSON.parse(text);
  const messages = text
    .split('\n')
    .filter((l) => l.startsWith('data:'))
    .map((l) => l.slice(5).trim())
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  const answer = messages.find((m) => m.id === id);
  if (!answer) throw new Error(`no answer to request ${id} in the event stream`);
  return answer;
}

/**
 * One 2026-07-28 request as the Tasks requester hands it over, POSTed to /mcp with the headers the
 * revision requires: `MCP-Protocol-Version`, `Mcp-Method`, and `Mcp-Name` for the methods whose body
 * names a tool or a task.
 */
function rawDispatcher(mcpUrl: URL, token: string) {
  let nextId = 1;
  return async (request: unknown, options?: { signal?: AbortSignal }): Promise<JsonRpcResponse> => {
    const { method, params } = request as { method: string; params?: Record<string, unknown> };
    const name =
      method === 'tools/call' ? params?.name : method.startsWith('tasks/') ? params?.taskId : undefined;
    const id = nextId++;
    const res = await fetch(mcpUrl, {
      method: 'POST',
      signal: options?.signal,
      headers: {
        Authorization: `Bearer ${token}`,
        'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream',
        'MCP-Protocol-Version': '2026-07-28',
        'Mcp-Method': method,
        ...(typeof name === 'string' ? { 'Mcp-Name': name } : {}),
      },
      body: JSON.stringify({ ...(request as object), jsonrpc: '2.0', id }),
    });
    const body = await answerTo(res, id);
    if ('error' in body) return { kind: 'error', error: body.error as never };
    return { kind: 'result', result: body.result as never };
  };
}

/** A connected client and its Tasks session on `url` (e.g. http://127.0.0.1:8787), as the agent `token`. */
export async function openTaskClient(url: string, token: string, revision: Revision = '2026-07-28') {
  const mcpUrl = new URL('/mcp', url);
  const client = new Client(
    CLIENT_INFO,
    revision === '2026-07-28' ? { versionNegotiation: { mode: { pin: '2026-07-28' } } } : {},
  );
  await client.connect(
    new StreamableHTTPClientTransport(mcpUrl, {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    }),
  );
  const endpointId = `countersign-${mcpUrl.href}`;
  const session = createTaskSessionFromClient(
    client,
    revision === '2026-07-28'
      ? {
          endpointId,
          rawDispatch: rawDispatcher(mcpUrl, token),
          v2RequestFraming: {
            protocolVersion: '2026-07-28',
            clientInfo: CLIENT_INFO,
            clientCapabilities: {},
          },
        }
      : { endpointId },
  );
  return {
    /** Calls a tool as a task where the server offers one (a countersign write with dry_run false). */
    callTool: (name: string, args: Record<string, JsonValue>) =>
      session.callTool(name, args, { task: { preference: 'prefer' } }),
    /** Waits for the task's end (a chair's decision, then the write) and gives the tool's result. */
    async result<T>(execution: ToolExecution<T>) {
      const { outcome } = await execution.settle();
      return resultFromTaskOutcome(outcome);
    },
    async close() {
      await session.close();
      await client.close();
    },
  };
}
