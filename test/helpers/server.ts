import path from 'node:path';
import type { Knex } from 'knex';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import type { CallToolResult } from '@modelcontextprotocol/client';
import { loadConfig } from '../../src/config.ts';
import { createLogger } from '../../src/log.ts';
import { fetchUnwarned } from '../../src/core/fetch.ts';
import { createAgent } from '../../src/accounts/agents.ts';
import { startHttpServer, type RunningServer } from '../../src/app/serve-http.ts';
import type { ServiceOptions } from '../../src/app/services.ts';
import type { CheckpointDeps } from '../../src/audit/index.ts';
import type { Config } from '../../src/config.ts';
import type { Logger } from '../../src/log.ts';
import { misnamedAgentRows } from './audit-names.ts';
import { builtCli, childEnv } from './built.ts';
import { createTestDatabase, type DbKind, type TestDatabase } from './db.ts';

export const ROOT = path.resolve(import.meta.dirname, '../..');

/**
 * A server started in this process, with its database as an administrator with SQL sees it. `sql` is
 * how a test inspects stored state (the rows a call left, a request's status) or tampers with it as
 * the insider of docs/audit.md ("Threat model") does: a row rewritten, deleted or forged. The server's
 * `services` are what its transports get, and never carry the database: `sql` comes from the
 * test-only `onDatabase` option of openServices. Inside a transaction, use its `trx` (PGlite has one
 * connection).
 */
export interface SqlServer extends RunningServer {
  sql: Knex;
}

/** startHttpServer, keeping the database it opened as the server's `sql` (see SqlServer). */
export async function startSqlServer(
  config: Config,
  log: Logger,
  options: ServiceOptions = {},
): Promise<SqlServer> {
  let sql: Knex | undefined;
  const server = await startHttpServer(config, log, {
    ...options,
    onDatabase(knex) {
      sql = knex;
      options.onDatabase?.(knex);
    },
  });
  if (!sql) throw new Error('the server started without opening its database');
  return { ...server, sql };
}

/**
 * The audit's checkpoint deps of a server (its signer, origin, guard and anchor) over the test's `sql`,
 * for a test that calls the audit's functions (createCheckpoint, exportAudit) itself.
 */
export const checkpointDepsOf = (server: SqlServer): CheckpointDeps => ({
  ...server.services.checkpoints,
  knex: server.sql,
});

export interface TestServer extends SqlServer {
  db: TestDatabase;
  /** Environment that points a child countersign process at this server's database. */
  env: Record<string, string>;
  /** The demo agent's token (created on first start). */
  demoToken: string;
  addAgent(name: string): Promise<string>;
  stop(): Promise<void>;
}

export function testEnv(db: TestDatabase, extra: Record<string, string> = {}): Record<string, string> {
  return {
    COUNTERSIGN_DATA_DIR: db.dataDir,
    // Named, not left to the data directory's default: every replica a suite starts on this database
    // shares the one host roots file, as an operator's replicas do (README, "Operations").
    COUNTERSIGN_HOST_ROOTS: path.join(db.dataDir, 'host-roots.json'),
    COUNTERSIGN_PORT: '0',
    LOG_LEVEL: 'silent',
    // Suites make many calls per agent; the rate-limit test sets its own limit.
    COUNTERSIGN_RATE_LIMIT_PER_MIN: '100000',
    // Suites count rows: a checkpoint's row appears when a suite asks for one (the cadence tests set theirs).
    COUNTERSIGN_CHECKPOINT_INTERVAL_S: '3600',
    ...(db.url ? { DATABASE_URL: db.url } : {}),
    ...extra,
  };
}

/** The real server, in this process, on a fresh database with the demo data. */
export async function startTestServer(
  kind: DbKind,
  extraEnv: Record<string, string> = {},
  options: ServiceOptions = {},
): Promise<TestServer> {
  const db = await createTestDatabase(kind);
  const env = testEnv(db, extraEnv);
  const config = loadConfig(env, db.dataDir);
  const server = await startSqlServer(config, createLogger(config.log_level), options);
  return {
    ...server,
    db,
    env,
    demoToken: server.services.firstRun!.token,
    addAgent: async (name) => (await createAgent(server.sql, { name })).token,
    async stop() {
      // Every row about an agent names it (docs/audit.md), checked for each suite that runs a server. A
      // suite that took the database away has nothing left to check.
      const misnamed = await misnamedAgentRows(server.sql).catch(() => []);
      await server.close();
      await db.drop();
      if (misnamed.length > 0) {
        throw new Error(
          `audit rows without their agent's name in details.agent_name: ${JSON.stringify(misnamed)}`,
        );
      }
    },
  };
}

/** The protocol eras a client can speak: the 2025 handshake (the SDK client's default) or 2026-07-28. */
export type Era = 'legacy' | 'modern';
export const ERAS: readonly Era[] = ['legacy', 'modern'];

export const newClient = (era: Era = 'legacy') =>
  new Client(
    { name: 'countersign-test', version: '1.0.0' },
    era === 'modern' ? { versionNegotiation: { mode: { pin: '2026-07-28' } } } : {},
  );

export async function connectHttp(url: string, token: string, era: Era = 'legacy'): Promise<Client> {
  const client = newClient(era);
  await client.connect(
    new StreamableHTTPClientTransport(new URL('/mcp', url), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
      // The transport's one signal, exempt from Node's leak warning as countersign's own upstream
      // clients are (a suite's thousands of calls otherwise print hundreds of warnings).
      fetch: fetchUnwarned,
    }),
  );
  return client;
}

/** countersign serve --stdio as a child process, driven by the SDK's stdio client. */
export async function connectStdio(
  env: Record<string, string>,
  era: Era = 'legacy',
): Promise<{ client: Client; stderr: () => string; exited: () => Promise<void> }> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [await builtCli(), 'serve', '--stdio'],
    env: childEnv(env),
    cwd: ROOT,
    stderr: 'pipe',
  });
  let stderr = '';
  transport.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const client = newClient(era);
  await client.connect(transport);
  const pid = transport.pid;
  /** Resolves once the server process is gone (after the client closed its stdin). */
  const exited = () =>
    waitFor('the stdio server to exit', async () => {
      if (pid === null || pid === undefined) return true;
      try {
        process.kill(pid, 0);
        return undefined;
      } catch {
        return true;
      }
    }).then(() => undefined);
  return { client, stderr: () => stderr, exited };
}

/** The envelope of a tool result (structuredContent), typed loosely for assertions. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- tests read arbitrary tool fields
export type Envelope = Record<string, any>;

export async function call(
  client: Client,
  name: string,
  args: Record<string, unknown> = {},
  opts: { timeout?: number } = {},
): Promise<Envelope> {
  const result = (await client.callTool({ name, arguments: args }, opts)) as CallToolResult;
  const env = result.structuredContent as Envelope;
  if (Boolean(result.isError) !== (env.ok === false)) throw new Error('isError and ok disagree');
  return env;
}

/** Polls `probe` until it returns a value (not undefined), for things that happen in the background. */
/** The HTTP status of an MCP initialize request made with `token`: 200 accepted, 401 refused. */
export async function initializeStatus(server: { url: string }, token: string): Promise<number> {
  const res = await fetch(new URL('/mcp', server.url), {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${token}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '1' } },
    }),
  });
  await res.body?.cancel();
  return res.status;
}

export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  limitMs = 20_000,
): Promise<T> {
  const until = Date.now() + limitMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > until) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
