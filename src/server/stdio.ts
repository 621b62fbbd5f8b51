import os from 'node:os';
import { ProtocolError, ProtocolErrorCode } from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';
import type { Authenticate } from '../accounts/index.ts';
import type { Refusals } from '../audit/index.ts';
import { AppError } from '../core/errors.ts';
import type { Agent } from '../core/identity.ts';
import type { Logger } from '../log.ts';
import type { CallPipeline } from './call.ts';
import { deniedRow } from './denied.ts';
import { createMcpServer } from './mcp.ts';

export interface McpStdioDeps {
  /** Resolves the agent token, at start and again at every request. */
  authenticate: Authenticate;
  pipeline: CallPipeline;
  /** Where refused tokens are recorded, as HTTP records them: a few rows a minute, then counted. */
  refusals: Refusals;
  log: Logger;
  version: string;
}

/** One agent served on stdin/stdout until its client closes stdin. */
export interface StdioConnection {
  /** Resolves when the client closes stdin. */
  ended: Promise<void>;
  /** Tears the connection down (after `ended`, or on a signal); the services stay open. */
  close(): Promise<void>;
}

/**
 * The source a stdio server's refusals are counted under. There is no client address: the client is
 * whoever started this process and holds its stdin, so the process is the source, named as its
 * server.started row names it (`stdio:<pid>@<host>`). Its refusals then have their own share of rows
 * a minute, apart from those of other stdio servers on one PostgreSQL database and of HTTP clients.
 */
const stdioSource = () => `stdio:${process.pid}@${os.hostname()}`;

/** The start-up refusal of COUNTERSIGN_AGENT_TOKEN (app/stdio-relay.ts says the same for a joined server). */
const tokenRefusedAtStart = (reason: string) =>
  new AppError('NOT_LOGGED_IN', `COUNTERSIGN_AGENT_TOKEN refused: ${reason.replace(/_/g, ' ')}`, reason);

/** The JSON-RPC error message of a request whose token no longer holds (and app/stdio-relay.ts's). */
const tokenRefusedAtRequest = (reason: string) => `agent token refused: ${reason}`;

/**
 * MCP over this process's stdin/stdout for the holder of one agent token. The token is checked at start
 * (`check`) and again at every request, so revoking the agent takes effect at its next call. Every
 * refusal goes through Refusals under this process's source (stdioSource): the first rows of a minute
 * are committed before the refusal is answered (a refused start has its row before the process ends),
 * and a client that keeps calling with a revoked token is counted into a summary row, not written a
 * row per call.
 */
export function createMcpStdio(deps: McpStdioDeps, token: string | undefined) {
  const at = { transport: 'stdio', ip: stdioSource() } as const;
  /** The agent, or the refusal once it is recorded. */
  async function authenticate() {
    const now = await deps.authenticate(token);
    if ('failure' in now) await deps.refusals.record(at.ip, deniedRow(now, at));
    return now;
  }
  return {
    /** The agent the token names; a refused token is recorded, then thrown as NOT_LOGGED_IN. */
    async check(): Promise<Agent> {
      const first = await authenticate();
      if ('failure' in first) throw tokenRefusedAtStart(first.failure);
      return first.agent;
    },
    /** Serves the agent until the client closes stdin (or `close`). */
    serve(): StdioConnection {
      const handle = serveStdio(() => serverFor(deps, authenticate), {
        onerror: (err) => deps.log.debug({ err: err.message }, 'stdio message refused'),
      });
      return connection(handle);
    },
  };
}

/** The connection's one MCP server, which asks for its caller at every request. */
function serverFor(deps: McpStdioDeps, authenticate: () => Promise<{ agent: Agent } | { failure: string }>) {
  const server = createMcpServer({
    version: deps.version,
    pipeline: deps.pipeline,
    async context() {
      const now = await authenticate();
      if ('failure' in now) {
        throw new ProtocolError(ProtocolErrorCode.InvalidRequest, tokenRefusedAtRequest(now.failure));
      }
      return { agent: now.agent };
    },
  });
  // Upstream tool lists change at run time: the client is told to list again.
  const unsubscribe = deps.pipeline.onListChanged(() => {
    server.sendToolListChanged().catch(() => undefined);
  });
  server.onclose = unsubscribe;
  return server;
}

/** The client closing stdin ends the connection, whichever way the end is seen ('end' or 'close'). */
function connection(handle: { close(): Promise<void> }): StdioConnection {
  let onEnd: () => void = () => undefined;
  const ended = new Promise<void>((resolve) => {
    onEnd = () => {
      process.stdin.off('end', onEnd);
      process.stdin.off('close', onEnd);
      resolve();
    };
    process.stdin.once('end', onEnd);
    process.stdin.once('close', onEnd);
  });
  let closing: Promise<void> | undefined;
  return {
    ended,
    close() {
      closing ??= (async () => {
        process.stdin.off('end', onEnd);
        process.stdin.off('close', onEnd);
        await handle.close().catch(() => undefined);
      })();
      return closing;
    },
  };
}
