import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import { AppError } from '../core/errors.ts';
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';
import { createWebRouter } from '../web/app.ts';
import { healthOf } from './health.ts';
import { createMcpRouter, hostGuard, sendProblem } from '../server/http.ts';
import { openServices, type ServiceOptions, type Services } from './services.ts';
import { VERSION } from '../server/version.ts';

export interface RunningServer {
  url: string;
  services: Services;
  close(): Promise<void>;
}

/** Builds the express app (MCP at /mcp; the web UI mounts here too) around already-open services. */
export function createApp(services: Services) {
  const mcp = createMcpRouter({
    authenticate: services.authenticate,
    pipeline: services.pipeline,
    audit: services.audit,
    bus: services.bus,
    config: services.config,
    log: services.log,
    version: VERSION,
  });
  const app = express();
  app.disable('x-powered-by');
  app.set('trust proxy', false);
  app.use('/mcp', mcp.router);
  app.get('/healthz', hostGuard(services.config), async (_req, res) => {
    const health = await healthOf(services);
    // 503 only when this replica cannot serve at all (no database): a balancer's health check must not
    // drop every replica because one upstream MCP server is down (the body still says "degraded").
    res.status(health.database.reachable ? 200 : 503).json(health);
  });
  app.get('/metrics', hostGuard(services.config), async (_req, res) => {
    res.type(services.metrics.registry.contentType).send(await services.metrics.registry.metrics());
  });
  app.use(
    createWebRouter({
      knex: services.knex,
      audit: services.audit,
      approvals: services.approvals,
      checkpoints: services.checkpoints,
      blobs: services.blobs,
      config: services.config,
      log: services.log,
    }),
  );
  app.use((_req, res) => sendProblem(res, { code: 'NOT_FOUND', reason: 'not_found', title: 'Not found' }));
  return { app, close: () => mcp.close() };
}

/** Binds the configured address, so that a taken port is known before the database is touched. */
async function bind(config: Config): Promise<Server> {
  const server = createServer();
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

/**
 * Binds HTTP first, then opens the database, applies migrations and sets up a first run: a port that is
 * taken stops start-up before anything (first-run credentials included) is created.
 */
export async function startHttpServer(
  config: Config,
  log: Logger,
  options: ServiceOptions = {},
): Promise<RunningServer> {
  const server = await bind(config);
  let services: Services;
  try {
    services = await openServices(config, log, 'countersign serve', options);
  } catch (err) {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    throw err;
  }
  try {
    const { app, close: closeApp } = createApp(services);
    server.on('request', app);
    const { port } = server.address() as AddressInfo;
    const host = config.http.host.includes(':') ? `[${config.http.host}]` : config.http.host;
    const url = `http://${host}:${port}`;
    services.listeningAt(url);
    log.info({ url: `${url}/mcp`, database: services.db.dialect }, 'countersign listening');
    return {
      url,
      services,
      async close() {
        await closeApp();
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
        await services.close();
      },
    };
  } catch (err) {
    server.close();
    await services.close();
    throw err;
  }
}
