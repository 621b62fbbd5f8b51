import path from 'node:path';
import type { Command } from 'commander';
import type { StdioReady } from '../app/serve-stdio.ts';
import type { JoinTarget } from '../app/stdio-join.ts';
import type { Config } from '../config.ts';
import { lockedBy } from '../db/lock.ts';
import type { Logger } from '../log.ts';
import { config, err, usageError } from './io.ts';
import { showFirstRun } from './run-data.ts';

/** `serve`, the default command: MCP over Streamable HTTP with the web UI, or over stdio. */
export function addServeCommand(cli: Command): void {
  cli
    .command('serve', { isDefault: true })
    .description('serve MCP over Streamable HTTP (default) or stdio')
    .option('--stdio', 'serve one agent over stdin/stdout (token from COUNTERSIGN_AGENT_TOKEN)')
    .option('--no-web', 'with --stdio: do not serve the web UI (approval and audit pages) on the HTTP port')
    .action(serve);
}

/** The file a stdio first run also writes its banner to: Claude Desktop keeps stderr only in its log. */
const FIRST_RUN_FILE = 'first-run-credentials.txt';

/** Where a stdio server's web form is; when it is not served, one line with the fix and the way to approve. */
async function showStdioReady(ready: StdioReady, cfg: Config): Promise<void> {
  const cliWay = 'chairs approve with: countersign approvals approve <id> --as <user>';
  if (ready.web.state === 'port_in_use')
    err(`countersign: port ${ready.web.port} is in use; set COUNTERSIGN_PORT or pass --no-web (${cliWay})`);
  if (ready.web.state === 'failed')
    err(
      `countersign: the web form is not served: ${ready.web.message}; set COUNTERSIGN_HOST/COUNTERSIGN_PORT or pass --no-web (${cliWay})`,
    );
  const web = ready.web.state === 'serving' ? ready.web.url : cfg.http.public_url;
  // Claude Desktop keeps a stdio server's stderr only in its log: the credentials go to a file as well.
  await showFirstRun(ready.firstRun, {
    mcp: 'stdio (set COUNTERSIGN_AGENT_TOKEN to the token below)',
    web,
    file: path.join(cfg.data_dir, FIRST_RUN_FILE),
  });
}

/**
 * `serve --stdio`: joins the server that already holds the embedded database (relaying stdin/stdout to
 * its MCP endpoint), else serves the database itself. Which of the two it does is said on stderr (stdout
 * is the MCP channel).
 */
async function serveOrJoinStdio(cfg: Config, log: Logger, web: boolean): Promise<void> {
  const token = process.env.COUNTERSIGN_AGENT_TOKEN;
  const { findRunningServer } = await import('../app/stdio-join.ts');
  const target = await findRunningServer(cfg, err);
  if (target) return joinRunningServer(cfg, target, token, log);
  err(
    cfg.database_url
      ? 'countersign: stdio serves the PostgreSQL database of DATABASE_URL itself (servers beside it share it)'
      : `countersign: stdio serves the data directory ${cfg.data_dir} itself (no running server holds it)`,
  );
  const { serveStdio } = await import('../app/serve-stdio.ts');
  try {
    await serveStdio(cfg, log, token, { web, onReady: (ready) => showStdioReady(ready, cfg) });
  } catch (e) {
    // A server took the database between the look above and the open: join it after all.
    if (!lockedBy(e)) throw e;
    const late = await findRunningServer(cfg, err);
    if (!late) throw e;
    return joinRunningServer(cfg, late, token, log);
  }
}

async function joinRunningServer(cfg: Config, target: JoinTarget, token: string | undefined, log: Logger) {
  err(
    `countersign: joined the running server (pid ${target.pid}): relaying this stdio connection to ${target.mcp}`,
  );
  const { checkJoinedToken, relayStdio } = await import('../app/stdio-relay.ts');
  await checkJoinedToken(target, token);
  await relayStdio(cfg, target, token, log);
}

async function serve(opts: { stdio?: boolean; web: boolean }): Promise<void> {
  const cfg = config();
  const { createLogger } = await import('../log.ts');
  const log = createLogger(cfg.log_level);
  if (opts.stdio) return serveOrJoinStdio(cfg, log, opts.web);
  if (!opts.web)
    throw usageError("option '--no-web' is for --stdio: an HTTP server serves the web UI with /mcp");
  const { startHttpServer } = await import('../app/serve-http.ts');
  // Listened for from the start: a signal during start-up stops the server cleanly once it is up.
  const signalled = new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
  // A signal while start-up waits for the database stops it there: nothing has been recorded yet.
  const started = startHttpServer(cfg, log);
  const server = await Promise.race([started, signalled.then(() => undefined)]);
  if (!server) {
    log.info('countersign stopped while starting');
    process.exit(0);
  }
  try {
    await showFirstRun(server.services.firstRun, { mcp: `${server.url}/mcp`, web: server.url });
    // A later start says how to get logins again: the first start's were printed that once.
    if (!server.services.firstRun && cfg.demo)
      err(
        `countersign: serving ${server.url}/mcp; the demo logins were printed at the first start only. ` +
          'New ones: countersign agent rotate demo, countersign user reset-password chair (or admin)',
      );
  } catch (e) {
    await server.close('error');
    throw e;
  }
  await signalled;
  await server.close('signal');
}
