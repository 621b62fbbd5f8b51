import {
  isJSONRPCNotification,
  isJSONRPCRequest,
  isJSONRPCResultResponse,
  SdkHttpError,
  StreamableHTTPClientTransport,
  type JSONRPCMessage,
} from '@modelcontextprotocol/client';
import { StdioServerTransport } from '@modelcontextprotocol/server/stdio';
import { ProtocolErrorCode } from '@modelcontextprotocol/server';
import type { Config } from '../config.ts';
import { AppError } from '../core/errors.ts';
import type { Logger } from '../log.ts';
import { stillRunning, type JoinTarget } from './stdio-join.ts';

/** How often the relay looks whether the server it joined still runs. */
const WATCH_MS = 500;

type RequestId = string | number;

/** What an HTTP refusal says, as RFC 9457 problem JSON (server/http.ts, core/problem.ts). */
function problemOf(err: unknown): { status?: number; reason?: string; detail?: string; title?: string } {
  if (!(err instanceof SdkHttpError)) return {};
  try {
    const text = typeof err.data.text === 'string' ? err.data.text : '';
    const body = JSON.parse(text) as { reason?: string; detail?: string; title?: string };
    return { status: err.status, ...body };
  } catch {
    return { status: err.status };
  }
}

/** Whether a send failed because nothing answers at the server's address any more. */
function unreachable(err: unknown): boolean {
  const cause = (err as { cause?: { code?: string } } | undefined)?.cause;
  return (
    err instanceof TypeError && ['ECONNREFUSED', 'ECONNRESET', 'UND_ERR_SOCKET'].includes(cause?.code ?? '')
  );
}

/**
 * The JSON-RPC error a direct stdio server gives where the HTTP endpoint refused: a refused token as
 * server/stdio.ts refuses it at a request, any other refusal with the problem's words. The words are
 * written here again rather than imported: the relay loads none of server/ (its front door would load
 * the whole MCP server for two sentences). The joined server records the refusal (server/http.ts).
 */
function errorFor(id: RequestId, err: unknown): JSONRPCMessage {
  const problem = problemOf(err);
  if (problem.status === 401) {
    return {
      jsonrpc: '2.0',
      id,
      error: {
        code: ProtocolErrorCode.InvalidRequest,
        message: `agent token refused: ${problem.reason ?? 'unauthorized'}`,
      },
    };
  }
  const message = problem.detail ?? problem.title ?? (err as Error).message;
  return {
    jsonrpc: '2.0',
    id,
    error: { code: ProtocolErrorCode.InternalError, message, ...(problem.status ? { data: problem } : {}) },
  };
}

/**
 * Checks the agent's token on the joined server before any message is relayed, so that a refused token
 * stops the start as it does when stdio serves the database itself (server/stdio.ts). The joined
 * server records the refusal as it records any refused HTTP request (auth.denied through its Refusals,
 * from the loopback address): the relay records nothing itself.
 */
export async function checkJoinedToken(target: JoinTarget, token: string | undefined): Promise<void> {
  let res: Response;
  try {
    res = await fetch(target.mcp, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 'countersign-join', method: 'ping' }),
      signal: AbortSignal.timeout(30_000),
    });
  } catch (err) {
    throw new AppError(
      'SOURCE_UNAVAILABLE',
      `the running server (pid ${target.pid}) did not answer at ${target.mcp}: ${(err as Error).message}`,
    );
  }
  const text = await res.text();
  if (res.status !== 401) return;
  const reason = (JSON.parse(text) as { reason?: string }).reason ?? 'unauthorized';
  throw new AppError(
    'NOT_LOGGED_IN',
    `COUNTERSIGN_AGENT_TOKEN refused: ${reason.replace(/_/g, ' ')}`,
    reason,
  );
}

/**
 * Sends each client message to the server: a request with an abort signal of its own, which a
 * notifications/cancelled naming it fires before the notification itself is passed on.
 */
function forwarder(
  http: StreamableHTTPClientTransport,
  inFlight: Map<RequestId, AbortController>,
  onInitialize: (id: RequestId) => void,
  failed: (message: JSONRPCMessage, err: unknown, aborted: boolean) => void,
) {
  return (message: JSONRPCMessage) => {
    let signal: AbortSignal | undefined;
    if (isJSONRPCRequest(message)) {
      if (message.method === 'initialize') onInitialize(message.id);
      const controller = new AbortController();
      inFlight.set(message.id, controller);
      signal = controller.signal;
    } else if (isJSONRPCNotification(message) && message.method === 'notifications/cancelled') {
      const id = (message.params as { requestId?: RequestId } | undefined)?.requestId;
      if (id !== undefined) inFlight.get(id)?.abort();
    }
    http
      .send(message, signal ? { requestSignal: signal } : undefined)
      .catch((err: unknown) => failed(message, err, signal?.aborted === true));
  };
}

/**
 * Relays this process's stdin/stdout JSON-RPC to the MCP endpoint of a running server, message by
 * message, in both directions: each client message is POSTed with the agent's token (the SDK's HTTP
 * client transport adds the headers each protocol revision asks for), and whatever the server answers
 * or streams back is written to stdout. A cancelled request's POST is aborted (the 2026-07-28 signal)
 * and the cancellation is passed on too (the 2025 one).
 *
 * Resolves when the client closes stdin or a signal comes. Rejects when the joined server stops, so the
 * process ends non-zero with a line saying so, never waiting on a server that is gone.
 */
export async function relayStdio(
  config: Config,
  target: JoinTarget,
  token: string | undefined,
  log: Logger,
): Promise<void> {
  const http = new StreamableHTTPClientTransport(new URL(target.mcp), {
    requestInit: { headers: token ? { Authorization: `Bearer ${token}` } : {} },
  });
  const stdio = new StdioServerTransport();
  const inFlight = new Map<RequestId, AbortController>();
  let initializeId: RequestId | undefined;

  return new Promise<void>((resolve, reject) => {
    let ended = false;
    const end = (failure?: AppError) => {
      if (ended) return;
      ended = true;
      clearInterval(watch);
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      for (const c of inFlight.values()) c.abort();
      void (async () => {
        await http.close().catch(() => undefined);
        await stdio.close().catch(() => undefined);
        if (failure) reject(failure);
        else resolve();
      })();
    };
    const gone = () =>
      end(
        new AppError(
          'SOURCE_UNAVAILABLE',
          `the running server (pid ${target.pid}) this stdio connection joined has stopped; ` +
            'start it again (npm start, or countersign serve) and restart the MCP client',
          'joined_server_stopped',
        ),
      );
    const onSignal = () => end();
    const watch = setInterval(() => {
      if (!stillRunning(config, target)) gone();
    }, WATCH_MS);

    const toClient = (message: JSONRPCMessage) => {
      if ('id' in message && !isJSONRPCRequest(message) && message.id !== undefined)
        inFlight.delete(message.id);
      // A 2025-era exchange carries its negotiated revision on every later request (a header).
      if (isJSONRPCResultResponse(message) && message.id === initializeId) {
        const version = (message.result as { protocolVersion?: unknown }).protocolVersion;
        if (typeof version === 'string') http.setProtocolVersion(version);
      }
      stdio.send(message).catch((err: unknown) => log.debug({ err }, 'stdout write failed'));
    };

    const toServer = forwarder(
      http,
      inFlight,
      (id) => (initializeId = id),
      (message, err, aborted) => {
        if (aborted || ended) return;
        if (unreachable(err) && !stillRunning(config, target)) return gone();
        log.debug({ err: (err as Error).message }, 'relayed message refused');
        if (isJSONRPCRequest(message)) {
          inFlight.delete(message.id);
          toClient(errorFor(message.id, err));
        }
      },
    );

    http.onmessage = toClient;
    http.onerror = (err) => log.debug({ err: err.message }, 'relay stream error');
    stdio.onmessage = toServer;
    stdio.onerror = (err) => log.debug({ err: err.message }, 'stdin message refused');
    stdio.onclose = () => end();
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    void http
      .start()
      .then(() => stdio.start())
      .catch((err: unknown) => end(new AppError('INTERNAL_ERROR', (err as Error).message)));
  });
}
