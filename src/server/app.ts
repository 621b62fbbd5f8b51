import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';
import { createWebRouter } from '../web/app.ts';
import { healthOf } from './health.ts';
import { createMcpRouter, hostGuard, sendProblem } from './http.ts';
import { openServices, type Services } from './services.ts';
import { VERSION } from './version.ts';

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
    res.status(health.status === 'ok' ? 200 : 503).json(health);
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
  app.use((_req, res) => sendProblem(res, 404, 'not_found', 'Not found'));
  return { app, close: () => mcp.close() };
}

/** Opens the database, applies migrations and serves HTTP on the configured host and port. */
export async function startHttpServer(config: Config, log: Logger): Promise<RunningServer> {
  const services = await openServices(config, log, 'countersign serve');
  try {
    const { app, close: closeApp } = createApp(services);
    const server: Server = await new Promise((resolve, reject) => {
      const s = app.listen(config.http.port, config.http.host, () => resolve(s));
      s.once('error', reject);
    });
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
    await services.close();
    throw err;
  }
}
