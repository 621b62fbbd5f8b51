import type { Server } from 'node:http';
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';
import type { FirstRun } from '../admin/first-run.ts';
import { createMcpStdio } from '../server/index.ts';
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

type McpStdio = ReturnType<typeof createMcpStdio>;

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
  const mcp = createMcpStdio(
    {
      authenticate: services.authenticate,
      pipeline: services.pipeline,
      refusals: services.refusals,
      log,
      version: VERSION,
    },
    token,
  );
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
    // A refused token stops the start; its auth.denied row is committed by then (server/stdio.ts).
    const agent = await mcp.check();
    log.info({ agent: agent.name, database: services.dialect }, 'countersign serving on stdio');
  } catch (err) {
    await stop('error');
    throw err;
  }
  return serveUntilEnd(mcp, stop);
}

/**
 * Serves MCP on stdin/stdout (server/stdio.ts) until the client closes stdin or a signal comes; then
 * tears the connection down and stops once.
 */
async function serveUntilEnd(mcp: McpStdio, stop: (reason: StopReason) => Promise<void>): Promise<void> {
  const connection = mcp.serve();
  let onSignal: () => void = () => undefined;
  const reason = await new Promise<StopReason>((resolve) => {
    onSignal = () => resolve('signal');
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    void connection.ended.then(() => resolve('stdin_closed'));
  });
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  await connection.close();
  await stop(reason);
}
