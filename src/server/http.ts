import { randomUUID } from 'node:crypto';
import express, { type NextFunction, type Request, type Response } from 'express';
import type { Knex } from 'knex';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { AuditUnavailableError, type AuditLog } from '../audit/log.ts';
import type { Config } from '../config.ts';
import { isConnectionError } from '../db/knex.ts';
import type { Logger } from '../log.ts';
import { authenticate, type Agent } from './agents.ts';
import { createMcpServer } from './mcp.ts';
import type { CallPipeline } from './pipeline.ts';

/** RFC 9457 problem details. `code` is the machine-readable kind, stable for clients and tests. */
export function sendProblem(
  res: Response,
  status: number,
  code: string,
  title: string,
  detail?: string,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent) return;
  res
    .status(status)
    .set({ 'Content-Type': 'application/problem+json', ...headers })
    .send(JSON.stringify({ type: `urn:countersign:problem:${code}`, title, status, detail, code }));
}

interface Session {
  transport: StreamableHTTPServerTransport;
  agentId: string;
  lastSeen: number;
}

const SESSION_IDLE_MS = 60 * 60 * 1000;

function bearer(req: Request): string | undefined {
  const header = req.get('authorization');
  const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
  return match?.[1];
}

/** Host and Origin must name this server, so a web page cannot reach a loopback countersign by DNS rebinding. */
export function hostGuard(config: Config) {
  const allowed = new Set(config.http.allowed_hosts.map((h) => h.toLowerCase()));
  const hostOk = (host: string) => {
    const name = host.toLowerCase().replace(/:\d+$/, '');
    return allowed.has(name);
  };
  return (req: Request, res: Response, next: NextFunction) => {
    const host = req.get('host');
    if (!host || !hostOk(host)) {
      return sendProblem(
        res,
        403,
        'host_not_allowed',
        'Host not allowed',
        `Host "${host ?? ''}" is not served here`,
      );
    }
    const origin = req.get('origin');
    if (origin) {
      let originHost: string;
      try {
        originHost = new URL(origin).host;
      } catch {
        originHost = '';
      }
      if (!hostOk(originHost)) {
        return sendProblem(
          res,
          403,
          'origin_not_allowed',
          'Origin not allowed',
          `Origin "${origin}" is not allowed`,
        );
      }
    }
    next();
  };
}

export interface McpHttpDeps {
  knex: Knex;
  pipeline: CallPipeline;
  audit: AuditLog;
  config: Config;
  log: Logger;
  version: string;
}

/**
 * Streamable HTTP at /mcp with stateful sessions. Every request is authenticated by its bearer token,
 * and a session only answers the agent that opened it.
 */
export function createMcpRouter(deps: McpHttpDeps) {
  const sessions = new Map<string, Session>();
  const router = express.Router();

  const deny = async (req: Request, res: Response, status: number, reason: string, agent?: Agent) => {
    await deps.audit.append({
      kind: 'auth.denied',
      agent_id: agent?.id ?? null,
      result: 'error',
      error_code: status === 401 ? 'UNAUTHENTICATED' : 'PERMISSION_DENIED',
      details: { reason, transport: 'http', ip: req.ip ?? null },
    });
    if (status === 401) {
      sendProblem(
        res,
        401,
        reason,
        'Unauthorized',
        'a valid agent token is required (Authorization: Bearer …)',
        {
          'WWW-Authenticate': 'Bearer realm="countersign"',
        },
      );
    } else {
      sendProblem(res, 403, reason, 'Forbidden', 'this MCP session belongs to another agent');
    }
  };

  router.use(hostGuard(deps.config));
  router.use(express.json({ limit: deps.config.http.max_body_bytes, type: ['application/json'] }));

  router.all('/', async (req: Request, res: Response) => {
    const auth = await authenticate(deps.knex, bearer(req));
    if ('failure' in auth) return deny(req, res, 401, auth.failure, auth.agent);
    const agent = auth.agent;

    const sessionId = req.get('mcp-session-id');
    if (sessionId) {
      const session = sessions.get(sessionId);
      if (!session)
        return sendProblem(res, 404, 'session_not_found', 'Session not found', 'start a new session');
      if (session.agentId !== agent.id) return deny(req, res, 403, 'session_of_other_agent', agent);
      session.lastSeen = Date.now();
      return session.transport.handleRequest(req, res, req.body);
    }

    if (req.method !== 'POST' || !isInitializeRequest(req.body)) {
      return sendProblem(
        res,
        400,
        'session_required',
        'Bad request',
        'send initialize first, then use mcp-session-id',
      );
    }

    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      // Not enableJsonResponse: SDK 1.32.2 then keeps every answered request of a session in memory
      // until the session closes (seen as a steady RSS climb in the soak drill, docs/reliability.md).
      onsessioninitialized: (id) => {
        sessions.set(id, { transport, agentId: agent.id, lastSeen: Date.now() });
      },
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
    };
    const server = createMcpServer({
      // The request was authenticated above; each later request of the session is checked the same way.
      authorize: async () => agent,
      pipeline: deps.pipeline,
      version: deps.version,
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, req.body);
  });

  router.use(
    (err: Error & { type?: string; status?: number }, _req: Request, res: Response, next: NextFunction) => {
      if (err.type === 'entity.too.large') {
        return sendProblem(
          res,
          413,
          'body_too_large',
          'Request body too large',
          `limit ${deps.config.http.max_body_bytes} bytes`,
        );
      }
      if (err.type === 'entity.parse.failed') {
        return sendProblem(
          res,
          400,
          'malformed_json',
          'Malformed JSON',
          'the request body is not valid JSON',
        );
      }
      if (err instanceof AuditUnavailableError || isConnectionError(err)) {
        // Authentication (and its audit) needs the database: a clear, retryable answer, never an HTML page.
        return sendProblem(
          res,
          503,
          'database_unavailable',
          'Service unavailable',
          'the database is unavailable; nothing was done; retry shortly',
          { 'Retry-After': '1' },
        );
      }
      if (res.headersSent) return next(err);
      deps.log.error({ err }, 'MCP endpoint failed');
      return sendProblem(res, 500, 'internal', 'Internal error');
    },
  );

  const sweep = setInterval(() => {
    const cutoff = Date.now() - SESSION_IDLE_MS;
    for (const [, s] of sessions) if (s.lastSeen < cutoff) void s.transport.close();
  }, 60_000);
  sweep.unref();

  return {
    router,
    sessionCount: () => sessions.size,
    async close() {
      clearInterval(sweep);
      await Promise.allSettled([...sessions.values()].map((s) => s.transport.close()));
      sessions.clear();
    },
  };
}
