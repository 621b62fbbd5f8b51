import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { startHttpServer } from '../../src/app/serve-http.ts';
import { loadConfig } from '../../src/config.ts';
import type { Faults } from '../../src/core/faults.ts';
import { createLogger } from '../../src/log.ts';
import { builtCli, childEnv } from '../helpers/built.ts';
import { runCli } from '../helpers/cli.ts';
import {
  createTestDatabase,
  databaseKinds,
  describeOnPostgres,
  openMigratedDatabase,
  type TestDatabase,
} from '../helpers/db.ts';
import { ROOT, testEnv, waitFor } from '../helpers/server.ts';

/** A loopback port nothing listens on (bound once by the system, then released). */
async function freePort(): Promise<number> {
  const probe = net.createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as net.AddressInfo;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}

/**
 * A request during start-up, answered within 15 s or failed: a server that accepts the connection and
 * never answers it fails here. Undefined while nothing listens on the port yet.
 */
async function probe(url: string, init: RequestInit = {}): Promise<Response | undefined> {
  try {
    return await fetch(url, { ...init, signal: AbortSignal.timeout(15_000) });
  } catch (err) {
    const code = (err as { cause?: { code?: string } }).cause?.code;
    if (code === 'ECONNREFUSED') return undefined;
    throw err;
  }
}

/** Asserts the answer of a server that is starting: 503 with Retry-After and the `starting` reason. */
async function assertStarting(base: string): Promise<void> {
  const health = await waitFor('the port to be bound', () => probe(`${base}/healthz`));
  assert.equal(health.status, 503);
  assert.ok(Number(health.headers.get('retry-after')) > 0, 'Retry-After on /healthz');
  assert.equal(((await health.json()) as { status: string }).status, 'starting');

  const mcp = await probe(`${base}/mcp`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
  });
  const page = await probe(`${base}/approvals`);
  for (const res of [mcp!, page!]) {
    assert.equal(res.status, 503);
    assert.ok(Number(res.headers.get('retry-after')) > 0, 'Retry-After');
    assert.match(res.headers.get('content-type') ?? '', /application\/problem\+json/);
    const problem = (await res.json()) as { code: string; reason: string; status: number };
    assert.deepEqual([problem.code, problem.reason, problem.status], ['SOURCE_UNAVAILABLE', 'starting', 503]);
  }
}

/** `countersign serve` (or `serve --stdio`) as a child process: its stderr so far and its exit code. */
async function startServe(env: Record<string, string>, args = ['serve']) {
  const child = spawn(process.execPath, [await builtCli(), ...args], {
    cwd: ROOT,
    env: childEnv(env),
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  let stdout = '';
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  return {
    stderr: () => stderr,
    stdout: () => stdout,
    /** The exit code, once the process has exited on its own within `limitMs`. */
    exitCode: (limitMs: number) =>
      Promise.race([
        exited,
        new Promise<never>((_, reject) =>
          setTimeout(
            () => reject(new Error(`still running after ${limitMs} ms: ${stderr}`)),
            limitMs,
          ).unref(),
        ),
      ]),
    terminate: () => child.kill('SIGTERM'),
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
}

/**
 * A PostgreSQL URL whose port refuses connections: port 1 (tcpmux) has no listener on a loopback
 * address, whereas a port freed a moment ago may be taken again by another process meanwhile.
 */
const CLOSED_PORT_URL = 'postgres://countersign@127.0.0.1:1/countersign';

/** The lines of stderr that are not JSON log lines: what a person reads. */
const plainLines = (stderr: string) =>
  stderr.split('\n').filter((line) => line.trim() !== '' && !line.startsWith('{'));

/** The JSON log lines with this message. */
const logLines = (stderr: string, msg: string) =>
  stderr
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as Record<string, unknown>)
    .filter((entry) => entry.msg === msg);

for (const kind of databaseKinds()) {
  describe(`the start-up window on ${kind}`, () => {
    let db: TestDatabase;
    before(async () => (db = await createTestDatabase(kind)));
    after(async () => db?.drop());

    it('answers every request 503 starting, with Retry-After, until its services are ready', async () => {
      // Start-up is held just before the database is opened, with the port already bound.
      let reached = () => {};
      const atWindow = new Promise<void>((resolve) => (reached = resolve));
      let release = () => {};
      const released = new Promise<void>((resolve) => (release = resolve));
      const faults: Faults = {
        async at(point) {
          if (point !== 'before_database') return;
          reached();
          await released;
        },
      };
      const port = await freePort();
      const config = loadConfig(testEnv(db, { COUNTERSIGN_PORT: String(port) }), db.dataDir);
      const starting = startHttpServer(config, createLogger('silent'), { faults });
      starting.catch(() => {});
      await Promise.race([
        atWindow,
        starting.then(() => assert.fail('start-up never reached the point before the database')),
      ]);
      const base = `http://127.0.0.1:${port}`;
      try {
        await assertStarting(base);
      } finally {
        release();
      }
      const server = await starting;
      try {
        const health = await fetch(`${base}/healthz`);
        assert.equal(health.status, 200);
        assert.notEqual(((await health.json()) as { status: string }).status, 'starting');
      } finally {
        await server.close();
      }
    });
  });
}

describeOnPostgres('a start-up whose database is held, on PostgreSQL', () => {
  let db: TestDatabase;
  before(async () => {
    // Migrated already: start-up's first question is whether knex_migrations lists every migration.
    const opened = await openMigratedDatabase('postgres');
    await opened.db.close();
    db = opened.testDb;
  });
  after(async () => db?.drop());

  /** A session holding knex_migrations (as a migration elsewhere, or a stuck transaction, would). */
  async function holdMigrations(): Promise<pg.Client> {
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    await holder.query('begin');
    await holder.query('lock table knex_migrations in access exclusive mode');
    return holder;
  }

  it('answers 503 starting while it waits, then serves once the database is free', async () => {
    const holder = await holdMigrations();
    const port = await freePort();
    const server = await startServe(
      testEnv(db, {
        COUNTERSIGN_PORT: String(port),
        LOG_LEVEL: 'info',
        COUNTERSIGN_DB_STARTUP_TIMEOUT_S: '120',
      }),
    );
    try {
      await assertStarting(`http://127.0.0.1:${port}`);
      await holder.query('rollback');
      await waitFor(
        'the server to be ready',
        async () => (/"url":"http:\/\/[^"]+\/mcp"/.test(server.stderr()) ? true : undefined),
        60_000,
      );
      assert.equal((await fetch(`http://127.0.0.1:${port}/healthz`)).status, 200);
    } finally {
      await holder.end();
      await server.stop();
    }
  });

  it('stops on SIGTERM while it waits, without waiting for the database', async () => {
    const holder = await holdMigrations();
    const port = await freePort();
    const server = await startServe(
      testEnv(db, {
        COUNTERSIGN_PORT: String(port),
        LOG_LEVEL: 'info',
        COUNTERSIGN_DB_STARTUP_TIMEOUT_S: '120',
      }),
    );
    try {
      await assertStarting(`http://127.0.0.1:${port}`);
      server.terminate();
      assert.equal(await server.exitCode(30_000), 0);
    } finally {
      await holder.end();
      await server.stop();
    }
    assert.equal(logLines(server.stderr(), 'countersign stopped while starting').length, 1);
  });

  it('exits 1 with one line naming the cause when the database stays held past database.startup_timeout_s', async () => {
    const holder = await holdMigrations();
    const port = await freePort();
    const server = await startServe(
      testEnv(db, {
        COUNTERSIGN_PORT: String(port),
        LOG_LEVEL: 'info',
        COUNTERSIGN_DB_STARTUP_TIMEOUT_S: '3',
      }),
    );
    try {
      await assertStarting(`http://127.0.0.1:${port}`);
      assert.equal(await server.exitCode(60_000), 1);
    } finally {
      await holder.end();
      await server.stop();
    }
    const stderr = server.stderr();
    const lines = plainLines(stderr);
    assert.equal(lines.length, 1, stderr);
    assert.equal(server.stdout(), '');
    assert.match(lines[0]!, /^countersign: .*database\.startup_timeout_s/);
    const retries = logLines(stderr, 'database not ready; retrying');
    assert.ok(retries.length >= 1, 'each failed attempt is logged');
    for (const r of retries) assert.equal(typeof r.reason, 'string');
  });
});

describe('a start-up whose PostgreSQL refuses connections', () => {
  let db: TestDatabase;
  before(async () => (db = await createTestDatabase('pglite')));
  after(async () => db?.drop());

  for (const args of [['serve'], ['serve', '--stdio']]) {
    it(`${args.join(' ')} logs each attempt's reason, then exits 1 with one line`, async () => {
      const server = await startServe(
        {
          ...testEnv(db),
          DATABASE_URL: CLOSED_PORT_URL,
          LOG_LEVEL: 'info',
          COUNTERSIGN_DB_STARTUP_TIMEOUT_S: '2',
          COUNTERSIGN_AGENT_TOKEN: 'cs_unused',
        },
        args,
      );
      try {
        assert.equal(await server.exitCode(60_000), 1);
      } finally {
        await server.stop();
      }
      const stderr = server.stderr();
      const retries = logLines(stderr, 'database not ready; retrying');
      assert.ok(retries.length >= 2, stderr);
      for (const r of retries) assert.match(String(r.reason), /ECONNREFUSED/);
      // --stdio first says which way it serves (itself, or by joining a running server), then the failure.
      const lines = plainLines(stderr).filter((l) => !/^countersign: stdio serves /.test(l));
      if (args.includes('--stdio'))
        assert.match(stderr, /stdio serves the PostgreSQL database of DATABASE_URL itself/);
      assert.equal(lines.length, 1, stderr);
      assert.match(lines[0]!, /^countersign: .*database\.startup_timeout_s.*ECONNREFUSED/);
      // Nothing on stdout (for --stdio, the MCP channel): no database driver's warnings either.
      assert.equal(server.stdout(), '');
    });
  }
});

describe('serve while PostgreSQL refuses connections', () => {
  let db: TestDatabase;
  before(async () => (db = await createTestDatabase('pglite')));
  after(async () => db?.drop());

  it('says what is wrong and what to do at its first failed attempt, while it keeps waiting', async () => {
    const server = await startServe({
      ...testEnv(db),
      DATABASE_URL: CLOSED_PORT_URL,
      LOG_LEVEL: 'warn',
      COUNTERSIGN_DB_STARTUP_TIMEOUT_S: '600',
    });
    try {
      const said = await waitFor('the first failure to be said', async () =>
        logLines(server.stderr(), 'database not ready; retrying').length > 0 ? server.stderr() : undefined,
      );
      const first = said
        .split('\n')
        .filter((line) => line.startsWith('{'))
        .map((line) => JSON.parse(line) as Record<string, unknown>)
        .find((entry) => /PostgreSQL is not reachable/.test(String(entry.msg)));
      assert.ok(first, said);
      assert.match(
        String(first.msg),
        /^PostgreSQL is not reachable at 127\.0\.0\.1:1 \(ECONNREFUSED\): start it, or fix the host and port in DATABASE_URL; still trying for up to 600 s \(database\.startup_timeout_s\)$/,
      );
      assert.equal(first.level, 40, 'a warning');
      // Said once, at the first attempt; the retries are logged as before.
      assert.equal(said.split('PostgreSQL is not reachable').length - 1, 1, said);
    } finally {
      server.terminate();
      await server.stop();
    }
  });
});

describe('CLI commands when the database is down', () => {
  let db: TestDatabase;
  before(async () => (db = await createTestDatabase('pglite')));
  after(async () => db?.drop());

  for (const args of [['agent', 'list'], ['migrate'], ['serve']]) {
    it(`${args.join(' ')} prints exactly one line and exits 1`, async () => {
      const res = await runCli(args, {
        ...testEnv(db),
        DATABASE_URL: CLOSED_PORT_URL,
        COUNTERSIGN_DB_STARTUP_TIMEOUT_S: '1',
      });
      assert.equal(res.code, 1);
      const lines = res.stderr.split('\n').filter((l) => l !== '');
      assert.equal(lines.length, 1, res.stderr);
      assert.match(lines[0]!, /^countersign: .*ECONNREFUSED/);
      // The database driver's own warning (a stack) was written to stdout before the line.
      assert.equal(res.stdout, '', 'nothing but the one line');
    });
  }
});
