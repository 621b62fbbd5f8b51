import type { Server } from 'node:http';
import { ProtocolError, ProtocolErrorCode } from '@modelcontextprotocol/server';
import { serveStdio as serveMcpStdio } from '@modelcontextprotocol/server/stdio';
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';
import type { AuthFailure } from '../accounts/index.ts';
import type { FirstRun } from '../admin/first-run.ts';
import type { Agent } from '../core/identity.ts';
import { AppError } from '../core/errors.ts';
import { createMcpServer } from '../server/index.ts';
import type { StopReason } from './lifecycle.ts';
import { bind, isPortInUse, serveApp, type WebServer } from './serve-http.ts';
import { openServices, type ServiceOptions, type Services } from './services.ts';
import { VERSION } from '../core/version.ts';

/** The web form of a stdio server: where it is served, or why not. */
export type StdioWeb =
  | { state: 'serving'; url: string }
  | { state: 'off' }
  | { state: 'port_in_use'; port: number }
  | { state: 'failed'; message: string };

/** What the CLI shows before the agent is served: where the web form is, and first-run credentials. */
export interface StdioReady {
  web: StdioWeb;
  firstRun?: FirstRun;
}

export interface StdioOptions extends ServiceOptions {
  /** Serve the web UI (not /mcp) on the configured HTTP host and port too; default true. */
  web?: boolean;
  /** Called once everything is open and before the token is checked; the CLI prints here. */
  onReady?(ready: StdioReady): Promise<void>;
}

/**
 * The web form, on the configured port, bound before the database is opened (as for HTTP). A port that
 * cannot be bound does not stop the MCP server: the chair then approves with the CLI.
 */
async function bindWeb(config: Config, wanted: boolean): Promise<{ server: Server } | { web: StdioWeb }> {
  if (!wanted) return { web: { state: 'off' } };
  try {
    return { server: await bind(config) };
  } catch (err) {
    if (isPortInUse(err)) return { web: { state: 'port_in_use', port: config.http.port } };
    return { web: { state: 'failed', message: (err as Error).message } };
  }
}

/**
 * Serves one agent over stdin/stdout. The agent is the holder of COUNTERSIGN_AGENT_TOKEN; the token is
 * checked again on every request, so revoking the agent takes effect at once. The web UI is served
 * beside it on the HTTP port unless turned off, so that review links answer.
 */
export async function serveStdio(
  config: Config,
  log: Logger,
  token: string | undefined,
  options: StdioOptions = {},
): Promise<void> {
  const bound = await bindWeb(config, options.web ?? true);
  let services: Services;
  try {
    services = await openServices(config, log, 'countersign serve --stdio', options);
  } catch (err) {
    if ('server' in bound) bound.server.close();
    throw err;
  }
  let webServer: WebServer | undefined;
  const stop = async (reason: StopReason) => {
    await webServer?.close();
    await services.close(reason);
  };
  try {
    let web: StdioWeb;
    if ('server' in bound) {
      webServer = serveApp(bound.server, services, { mcp: false });
      web = { state: 'serving', url: webServer.url };
    } else web = bound.web;
    await services.recordStart('stdio');
    await options.onReady?.({ web, firstRun: services.firstRun });
    await checkToken(services, token);
  } catch (err) {
    await stop('error');
    throw err;
  }
  return serveAgent(services, log, token, stop);
}

/** Appends auth.denied for a token refused at start or on a request. */
function deny(services: Services, refused: { failure: AuthFailure; agent?: Pick<Agent, 'id' | 'name'> }) {
  const { agent } = refused;
  return services.audit.append({
    kind: 'auth.denied',
    agent_id: agent?.id ?? null,
    result: 'error',
    error_code: refused.failure === 'agent_record_tampered' ? 'TAMPERED' : 'UNAUTHENTICATED',
    details: { reason: refused.failure, transport: 'stdio', ...(agent ? { agent_name: agent.name } : {}) },
  });
}

async function checkToken(services: Services, token: string | undefined): Promise<void> {
  const first = await services.authenticate(token);
  if (!('failure' in first)) {
    services.log.info(
      { agent: first.agent.name, database: services.dialect },
      'countersign serving on stdio',
    );
    return;
  }
  await deny(services, first);
  throw new AppError(
    'NOT_LOGGED_IN',
    `COUNTERSIGN_AGENT_TOKEN refused: ${first.failure.replace(/_/g, ' ')}`,
    first.failure,
  );
}

/** MCP on stdin/stdout until the client closes stdin or a signal comes; then stops once. */
function serveAgent(
  services: Services,
  log: Logger,
  token: string | undefined,
  stop: (reason: StopReason) => Promise<void>,
): Promise<void> {
  const handle = serveMcpStdio(
    () => {
      const server = createMcpServer({
        version: VERSION,
        pipeline: services.pipeline,
        // The token is checked again at each request: a revoked agent is refused at its next call.
        async context() {
          const now = await services.authenticate(token);
          if ('failure' in now) {
            await deny(services, now);
            throw new ProtocolError(ProtocolErrorCode.InvalidRequest, `agent token refused: ${now.failure}`);
          }
          return { agent: now.agent };
        },
      });
      // Upstream tool lists change at run time: this connection's client is told to list again.
      const unsubscribe = services.pipeline.onListChanged(() => {
        server.sendToolListChanged().catch(() => undefined);
      });
      server.onclose = unsubscribe;
      return server;
    },
    { onerror: (err) => log.debug({ err: err.message }, 'stdio message refused') },
  );

  // The client closing stdin ends the connection: close once, whichever way the end is seen.
  return new Promise<void>((resolve) => {
    let stopping = false;
    const end = (reason: StopReason) => {
      if (stopping) return;
      stopping = true;
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      void (async () => {
        await handle.close().catch(() => undefined);
        await stop(reason);
        resolve();
      })();
    };
    const onSignal = () => end('signal');
    process.stdin.once('end', () => end('stdin_closed'));
    process.stdin.once('close', () => end('stdin_closed'));
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
  });
}
