import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { getDefaultEnvironment, StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import {
  Client,
  StreamableHTTPClientTransport,
  ProtocolError,
  SdkError,
  SdkErrorCode,
} from '@modelcontextprotocol/client';
import type { Transport, CallToolResult, Tool } from '@modelcontextprotocol/client';
import type { UpstreamConfig } from '../../config.ts';
import type { Logger } from '../../log.ts';
import { AppError } from '../../core/errors.ts';

export type UpstreamState = 'connecting' | 'up' | 'down' | 'closed';

/** One tool as the upstream lists it, with the hash of its input schema (bound into approvals). */
export interface UpstreamTool {
  tool: Tool;
  input_schema_sha256: string;
}

export interface UpstreamStatus {
  name: string;
  state: UpstreamState;
  tools: number;
  last_error: string | null;
  connected_at: string | null;
}

/** A connection to one upstream MCP server that keeps itself up: reconnects with backoff, follows list changes. */
export interface Upstream {
  readonly name: string;
  /** `mcp:<name>`, reported as `source`. */
  readonly source: string;
  status(): UpstreamStatus;
  /** The tools of the last successful listing (kept while the upstream is down). */
  tools(): ReadonlyMap<string, UpstreamTool>;
  /** Resolves when the first connection attempt has settled, whatever its outcome. */
  readonly firstAttempt: Promise<void>;
  /** Called after every listing that changed the tools (including the first). */
  onToolsChanged(listener: () => void): void;
  /** The SOURCE_UNAVAILABLE its tools answer while it is not connected. */
  unavailable(): AppError;
  /** Throws SOURCE_UNAVAILABLE unless the upstream is connected. */
  assertUp(): void;
  /** Lists the tools again (another replica heard that they changed); a failure is logged, not thrown. */
  refresh(): Promise<void>;
  /** Calls a tool; upstream failures come back as AppError (SOURCE_UNAVAILABLE, TIMEOUT, CONNECTOR_FAILED). */
  call(tool: string, args: Record<string, unknown>, signal: AbortSignal): Promise<CallToolResult>;
  /** The stdio child's process id, when there is one running. */
  pid(): number | undefined;
  close(): Promise<void>;
}

const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 30_000;
/** How much of an upstream's error text is kept in the envelope and the audit row. */
const MAX_ERROR_TEXT = 2000;

export const schemaSha256 = (schema: unknown) =>
  createHash('sha256')
    .update(canonicalize(schema ?? {}) ?? '')
    .digest('hex');

/** The text an upstream put into an `isError` result, trimmed to a readable size. */
export function errorText(result: CallToolResult): string {
  const text = result.content
    .map((c) => (c.type === 'text' ? c.text : `[${c.type}]`))
    .join('\n')
    .trim();
  return (text || 'the upstream reported an error without text').slice(0, MAX_ERROR_TEXT);
}

function transportFor(cfg: UpstreamConfig): Transport {
  if (cfg.command) {
    return new StdioClientTransport({
      command: cfg.command,
      args: cfg.args ?? [],
      env: { ...getDefaultEnvironment(), ...cfg.env },
      ...(cfg.cwd ? { cwd: cfg.cwd } : {}),
      stderr: 'pipe',
    });
  }
  return new StreamableHTTPClientTransport(new URL(cfg.url!), {
    requestInit: { headers: cfg.headers ?? {} },
  });
}

const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err)).slice(0, 500);

export function connectUpstream(
  cfg: UpstreamConfig,
  opts: { log: Logger; timeoutMs: number; clientVersion: string },
): Upstream {
  const log = opts.log.child({ upstream: cfg.name });
  const source = `mcp:${cfg.name}`;
  let state: UpstreamState = 'connecting';
  let client: Client | undefined;
  let transport: Transport | undefined;
  let tools = new Map<string, UpstreamTool>();
  let lastError: string | null = null;
  let connectedAt: string | null = null;
  let attempt = 0;
  let retryTimer: NodeJS.Timeout | undefined;
  const listeners: (() => void)[] = [];
  // A function, not a comparison, because state changes while a connection attempt awaits.
  const closed = () => state === 'closed';

  const setDown = (reason: string) => {
    if (state === 'closed') return;
    const wasUp = state === 'up';
    state = 'down';
    lastError = reason;
    if (wasUp) log.warn({ reason }, 'upstream disconnected; reconnecting');
    scheduleReconnect();
  };

  function scheduleReconnect() {
    if (state === 'closed' || retryTimer) return;
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** Math.min(attempt, 16));
    attempt++;
    retryTimer = setTimeout(
      () => {
        retryTimer = undefined;
        void connect();
      },
      delay * (0.75 + Math.random() * 0.5),
    );
    retryTimer.unref();
  }

  async function refreshTools(c: Client) {
    const next = new Map<string, UpstreamTool>();
    let cursor: string | undefined;
    do {
      const page = await c.listTools(cursor ? { cursor } : undefined, { timeout: opts.timeoutMs });
      for (const tool of page.tools) {
        next.set(tool.name, { tool, input_schema_sha256: schemaSha256(tool.inputSchema) });
      }
      cursor = page.nextCursor;
    } while (cursor);
    const before = JSON.stringify([...tools.entries()].map(([n, t]) => [n, t.input_schema_sha256, t.tool]));
    const after = JSON.stringify([...next.entries()].map(([n, t]) => [n, t.input_schema_sha256, t.tool]));
    tools = next;
    if (before !== after) {
      log.info({ tools: next.size }, 'upstream tools listed');
      for (const listener of listeners) listener();
    }
  }

  /** Lists again after word of a change (the upstream's own, or another replica's); failures are logged. */
  const relist = (c: Client) =>
    refreshTools(c).catch((err: unknown) =>
      log.warn({ err: messageOf(err) }, 'relisting upstream tools failed'),
    );

  async function connect() {
    if (closed()) return;
    const c = new Client({ name: 'countersign', version: opts.clientVersion });
    const t = transportFor(cfg);
    if (t instanceof StdioClientTransport) {
      t.stderr?.on('data', (chunk: Buffer) =>
        log.debug({ stderr: chunk.toString().trimEnd() }, 'upstream stderr'),
      );
    }
    try {
      await c.connect(t, { timeout: opts.timeoutMs });
      if (closed()) {
        await c.close();
        return;
      }
      c.setNotificationHandler('notifications/tools/list_changed', () => relist(c));
      await refreshTools(c);
      client = c;
      transport = t;
      state = 'up';
      attempt = 0;
      lastError = null;
      connectedAt = new Date().toISOString();
      // Set after the first listing so that a failed start is handled by the catch below, once.
      c.onclose = () => {
        if (client === c) {
          client = undefined;
          setDown('connection closed');
        }
      };
      log.info({ tools: tools.size }, 'upstream connected');
    } catch (err) {
      await c.close().catch(() => undefined);
      lastError = messageOf(err);
      if (!closed()) {
        state = 'down';
        log.warn({ err: lastError, attempt }, 'upstream connection failed; retrying');
        scheduleReconnect();
      }
    }
  }

  /** Maps what can go wrong in a call to the envelope's codes; a transport failure also takes the upstream down. */
  function failure(err: unknown, c: Client, signal: AbortSignal): AppError {
    if (err instanceof AppError) return err;
    // Our own deadline or the agent's cancellation: the upstream itself is fine.
    if (signal.aborted) {
      return new AppError('TIMEOUT', `the call to upstream "${cfg.name}" was cancelled`, 'cancelled');
    }
    if (err instanceof SdkError && err.code === SdkErrorCode.RequestTimeout) {
      return new AppError('TIMEOUT', `upstream "${cfg.name}" did not answer in time`, 'upstream_timeout');
    }
    if (err instanceof SdkError && err.code === SdkErrorCode.ConnectionClosed) {
      if (client === c) {
        client = undefined;
        setDown('connection closed during a call');
      }
      return unavailable('connection closed during the call');
    }
    if (err instanceof ProtocolError) {
      return new AppError(
        'CONNECTOR_FAILED',
        `upstream "${cfg.name}" answered with an error: ${err.message}`.slice(0, MAX_ERROR_TEXT),
        'upstream_protocol_error',
        { details: { rpc_code: err.code } },
      );
    }
    // Anything else is the transport failing (an HTTP upstream unreachable, a broken pipe).
    if (client === c) {
      client = undefined;
      void c.close().catch(() => undefined);
      setDown(messageOf(err));
    }
    return unavailable(messageOf(err));
  }

  const unavailable = (why: string | null) =>
    new AppError(
      'SOURCE_UNAVAILABLE',
      `upstream "${cfg.name}" is not connected${why ? ` (${why})` : ''}; countersign keeps reconnecting`,
      'upstream_down',
    );

  const firstAttempt = connect();

  return {
    name: cfg.name,
    source,
    firstAttempt,
    status: () => ({
      name: cfg.name,
      state,
      tools: tools.size,
      last_error: lastError,
      connected_at: connectedAt,
    }),
    tools: () => tools,
    onToolsChanged(listener) {
      listeners.push(listener);
    },
    unavailable: () => unavailable(lastError),
    assertUp() {
      if (!client || state !== 'up') throw unavailable(lastError);
    },
    async refresh() {
      if (client && state === 'up') await relist(client);
    },
    async call(tool, args, signal) {
      const c = client;
      if (!c || state !== 'up') throw unavailable(lastError);
      try {
        return (await c.callTool(
          { name: tool, arguments: args },
          {
            signal,
            timeout: opts.timeoutMs,
          },
        )) as CallToolResult;
      } catch (err) {
        throw failure(err, c, signal);
      }
    },
    pid: () => (transport instanceof StdioClientTransport ? (transport.pid ?? undefined) : undefined),
    async close() {
      state = 'closed';
      clearTimeout(retryTimer);
      const c = client;
      client = undefined;
      await c?.close().catch(() => undefined);
    },
  };
}
