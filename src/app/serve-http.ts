import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import { announceMcp } from '../admin/endpoint.ts';
import { AppError, isAppError } from '../core/errors.ts';
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';
import { createWebRouter } from '../web/app.ts';
import { healthOf } from './health.ts';
import { answerStarting } from './starting.ts';
import { webCommands } from './web-commands.ts';
import {
  createMcpEndpoint,
  hostGuard,
  isMcpPath,
  metricsGuard,
  protectedResourceRouter,
} from '../server/index.ts';
import { sendProblem } from '../core/problem.ts';
import { openServices, type ServiceOptions, type Services } from './services.ts';
import type { StopReason } from './lifecycle.ts';
import { VERSION } from '../core/version.ts';
import { dataDirLocked, lockHolder, noteServingUrl } from '../db/lock.ts';

export interface RunningServer {
  url: string;
  services: Services;
  /** Stops serving, records server.stopped (default reason: a signal) and closes the services. */
  close(reason?: StopReason): Promise<void>;
}

/**
 * The request handler around already-open services: unless `mcp` is false the MCP endpoint at /mcp,
 * answered ahead of express, and the express app for the rest — the web UI (login, approval and audit
 * pages), /healthz and /metrics. A stdio server serves its one agent on stdio and serves the rest only.
 */
export function createApp(services: Services, opts: { mcp?: boolean } = {}) {
  const mcp =
    opts.mcp === false
      ? undefined
      : createMcpEndpoint({
          authenticate: services.authenticate,
          oauth: services.oauth,
          pipeline: services.pipeline,
          audit: services.audit,
          refusals: services.refusals,
          bus: services.bus,
          config: services.config,
          log: services.log,
          version: VERSION,
        });
  const app = express();
  app.disable('x-powered-by');
  app.set('trust proxy', false);
  // RFC 9728 metadata, only when agents may bring OAuth tokens (docs/identity.md).
  if (mcp && services.oauth) app.use(protectedResourceRouter(services.oauth));
  app.get('/healthz', hostGuard(services.config), async (_req, res) => {
    const health = await healthOf(services);
    // 503 only when this replica cannot serve at all (no database): a balancer's health check must not
    // drop every replica because one upstream MCP server is down (the body still says "degraded").
    res.status(health.database.reachable ? 200 : 503).json(health);
  });
  // Loopback clients only, unless metrics.token is set (docs/operations.md).
  const metricsAccess = [hostGuard(services.config), metricsGuard(services.config.metrics.token)];
  app.get('/metrics', ...metricsAccess, async (_req, res) => {
    res.type(services.metrics.registry.contentType).send(await services.metrics.registry.metrics());
  });
  app.use(
    createWebRouter({
      sessions: services.sessions,
      people: services.people,
      slackStore: services.slackStore,
      audit: services.audit,
      auditReader: services.auditReader,
      auditExports: services.auditExports,
      signIn: services.signIn,
      refusals: services.refusals,
      approvals: services.approvals,
      checkpoints: services.checkpoints,
      blobs: services.blobs,
      config: services.config,
      log: services.log,
      commands: webCommands(services.admin),
    }),
  );
  app.use((_req, res) => sendProblem(res, { code: 'NOT_FOUND', reason: 'not_found', title: 'Not found' }));
  const handle = (req: IncomingMessage, res: ServerResponse) => {
    if (mcp && isMcpPath(req.url)) void mcp.handle(req, res);
    else app(req, res);
  };
  return { handle, close: async () => mcp?.close() };
}

/** The refusal of a taken port; its message names the fix. */
export const isPortInUse = (err: unknown) => isAppError(err, 'LOCKED', 'port_in_use');

/**
 * Binds the configured address, so that a taken port is known before the database is touched. Until
 * serveApp swaps in the app, every request is answered 503 `starting` (answerStarting).
 */
export async function bind(config: Config): Promise<Server> {
  const since = new Date();
  const server = createServer((req, res) => answerStarting(req, res, since));
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE') {
        reject(
          // Said with the fix, before anything was set up.
          new AppError(
            'LOCKED',
            `port ${config.http.port} on ${config.http.host} is in use; set COUNTERSIGN_PORT (http.port) ` +
              'to a free port, or stop what listens there',
            'port_in_use',
          ),
        );
      } else reject(err);
    });
    server.listen(config.http.port, config.http.host, () => resolve());
  });
  return server;
}

export interface WebServer {
  /** Where it listens, e.g. http://127.0.0.1:8787. */
  url: string;
  close(): Promise<void>;
}

/** Where a bound server listens, e.g. http://127.0.0.1:8787. */
function baseUrl(server: Server, config: Config): string {
  const { port } = server.address() as AddressInfo;
  const host = config.http.host.includes(':') ? `[${config.http.host}]` : config.http.host;
  return `http://${host}:${port}`;
}

/** Serves the app on a bound server and tells the services its address (the base of review links). */
export function serveApp(server: Server, services: Services, opts: { mcp?: boolean } = {}): WebServer {
  const { handle, close: closeApp } = createApp(services, opts);
  // The app replaces the start-up answer: from here on each request is served.
  server.removeAllListeners('request');
  server.on('request', handle);
  const url = baseUrl(server, services.config);
  services.listeningAt(url);
  return {
    url,
    async close() {
      await closeApp();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * Binds HTTP first, then opens the database, applies migrations and sets up a first run: a port that is
 * taken stops start-up before anything (first-run credentials included) is created. Before that, an
 * embedded database held by another process is said as such (with where that one serves): a second
 * start on the same data directory would otherwise first hear of the port and only then of the lock.
 */
export async function startHttpServer(
  config: Config,
  log: Logger,
  options: ServiceOptions = {},
): Promise<RunningServer> {
  // A second start on a held data directory learns that, not that the first one's port is taken.
  const holder = config.database_url ? undefined : lockHolder(config.pglite_dir);
  if (holder) throw dataDirLocked(config.pglite_dir, holder);
  const server = await bind(config);
  log.info({ listening: baseUrl(server, config) }, 'countersign starting; answering 503 until ready');
  let services: Services;
  try {
    services = await openServices(config, log, 'countersign serve', options);
  } catch (err) {
    server.closeAllConnections(); // clients kept alive on a 503 starting
    await new Promise<void>((resolve) => server.close(() => resolve()));
    throw err;
  }
  try {
    const web = serveApp(server, services);
    if (!config.database_url) noteServingUrl(config.pglite_dir, web.url);
    await services.recordStart('http');
    // A `serve --stdio` started on the same data directory joins this server at its MCP endpoint.
    if (services.dialect === 'pglite') announceMcp(config.data_dir, `${web.url}/mcp`);
    log.info({ url: `${web.url}/mcp`, database: services.dialect }, 'countersign listening');
    return {
      url: web.url,
      services,
      async close(reason) {
        await web.close();
        await services.close(reason);
      },
    };
  } catch (err) {
    server.close();
    await services.close('error');
    throw err;
  }
}
