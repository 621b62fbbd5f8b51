import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { WebClient } from '../helpers/browser-less.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, connectStdio, testEnv, waitFor } from '../helpers/server.ts';

/** Something else listening on a loopback port. */
async function occupy(): Promise<{ port: number; close(): Promise<void> }> {
  const blocker = net.createServer();
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
  const { port } = blocker.address() as net.AddressInfo;
  return { port, close: () => new Promise<void>((resolve) => blocker.close(() => resolve())) };
}

describe('start-up on a fresh data directory', () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  before(async () => {
    db = await createTestDatabase('pglite');
    // A data dir with nothing in it: the first run has not happened.
    fs.rmSync(path.join(db.dataDir, 'pglite'), { recursive: true, force: true });
    env = testEnv(db);
  });
  after(async () => db?.drop());

  it('refuses a taken port before it sets anything up, so the first run is not spent', async () => {
    const blocker = await occupy();
    try {
      const res = await runCli(['serve'], { ...env, COUNTERSIGN_PORT: String(blocker.port) });
      assert.equal(res.code, 1);
      assert.match(res.stderr, new RegExp(`port ${blocker.port} .*in use; set COUNTERSIGN_PORT`));
      assert.doesNotMatch(res.stderr, /\n\s+at /, 'no stack trace');
      assert.equal(fs.existsSync(path.join(db.dataDir, 'pglite')), false, 'no database was created');
    } finally {
      await blocker.close();
    }
    // The next start, on a free port, is the first run: its credentials are printed.
    const server = await spawnServer(env);
    try {
      await waitFor('the first-run banner', async () =>
        /demo agent token \(shown once\): cs_/.test(server.stderr()) ? true : undefined,
      );
    } finally {
      await stopChild(server.child);
    }
  });
});

/** The credentials a first-run banner shows (undefined where it shows none). */
function banner(stderr: string): { token?: string; chair?: string; password?: string } {
  const token = /demo agent token \(shown once\): (cs_\S+)/.exec(stderr)?.[1];
  const login = /chair login \(shown once\): (\S+) \/ (\S+)/.exec(stderr);
  return { token, chair: login?.[1], password: login?.[2] };
}

/** Audit rows of `kind` with actor first-run, read through an export of the log. */
async function firstRunRows(env: Record<string, string>, dir: string, kind: string) {
  const file = path.join(dir, `first-run-${kind}-${Date.now()}.jsonl`);
  const res = await runCli(['audit', 'export', '--kind', kind, '-o', file], env);
  assert.equal(res.code, 0, res.stderr);
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { actor: string; details: Record<string, unknown> })
    .filter((row) => row.actor === 'first-run');
}

for (const kind of databaseKinds()) {
  describe(`first-run credentials are never lost on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    before(async () => {
      db = await createTestDatabase(kind);
      // Nothing in it: the first run has not happened (PostgreSQL test databases start empty).
      fs.rmSync(path.join(db.dataDir, 'pglite'), { recursive: true, force: true });
      env = testEnv(db);
    });
    after(async () => db?.drop());

    it('a start that dies after the first-run setup leaves the next start to show working credentials, once', async () => {
      // Killed once the demo agent and the chair exist, before anything showed their credentials.
      await assert.rejects(spawnServer(env, { crashAt: 'after_first_run' }), (err: Error) => {
        assert.doesNotMatch(err.message, /shown once/);
        return true;
      });

      const second = await spawnServer(env);
      let shown: ReturnType<typeof banner>;
      try {
        shown = await waitFor('the renewed banner', async () => {
          const b = banner(second.stderr());
          return b.token && b.password ? b : undefined;
        });
        assert.match(second.stderr(), /first run, continued/);
        assert.equal(shown.chair, 'chair');
        assert.match(second.stderr(), /admin and compliance login \(shown once\): admin \/ \S+/);
        const web = new WebClient(second.url);
        const login = await web.login('chair', shown.password!);
        assert.equal(login.res.status, 303);
        assert.equal(login.res.headers.get('location'), '/approvals', 'signed in with the printed password');
        const agent = await connectHttp(second.url, shown.token!);
        try {
          const found = await call(agent, 'isphere_search_contacts', { query: 'David' });
          assert.equal(found.ok, true, 'the printed token works');
        } finally {
          await agent.close();
        }
      } finally {
        await stopChild(second.child);
      }

      const third = await spawnServer(env);
      try {
        // Its own requests are served, so its start-up (where a banner would be printed) is over.
        assert.equal((await fetch(new URL('/healthz', third.url))).status, 200);
      } finally {
        await stopChild(third.child);
      }
      assert.doesNotMatch(third.stderr(), /shown once|first run/);
      const stillWorks = await spawnServer(env);
      try {
        const agent = await connectHttp(stillWorks.url, shown.token!);
        assert.equal((await call(agent, 'isphere_search_contacts', { query: 'David' })).ok, true);
        await agent.close();
      } finally {
        await stopChild(stillWorks.child);
      }

      // Renewed through the audited commands, by first-run; once only.
      const rotated = await firstRunRows(env, db.dataDir, 'agent.token_rotated');
      assert.deepEqual(
        rotated.map((r) => r.details.agent),
        ['demo'],
      );
      const reset = await firstRunRows(env, db.dataDir, 'user.password_reset');
      assert.deepEqual(
        reset.map((r) => r.details.user),
        ['chair', 'admin'],
      );
    });
  });

  describe(`first run under stdio on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    before(async () => {
      db = await createTestDatabase(kind);
      fs.rmSync(path.join(db.dataDir, 'pglite'), { recursive: true, force: true });
      env = testEnv(db);
    });
    after(async () => db?.drop());

    it('shows the first-run credentials on stderr, so that the next stdio start can use the token', async () => {
      // No token yet: the first start says which one to use, then refuses to serve without it.
      const first = await runCli(['serve', '--stdio'], env);
      assert.equal(first.code, 1);
      assert.match(first.stderr, /missing token/);
      assert.equal(first.stdout, '', 'stdout is the MCP channel');
      const shown = banner(first.stderr);
      assert.ok(shown.token && shown.password, first.stderr);
      // Claude Desktop keeps stderr only in its log: the same credentials are in a file only its owner reads.
      const file = path.join(db.dataDir, 'first-run-credentials.txt');
      assert.ok(first.stderr.includes(`also written to ${file}, readable by you alone`), first.stderr);
      assert.equal(fs.statSync(file).mode & 0o777, 0o600);
      const kept = banner(fs.readFileSync(file, 'utf8'));
      assert.deepEqual(kept, shown);

      const { client, stderr, exited } = await connectStdio({
        ...env,
        COUNTERSIGN_AGENT_TOKEN: shown.token!,
      });
      try {
        assert.equal((await call(client, 'isphere_search_contacts', { query: 'David' })).ok, true);
      } finally {
        await client.close();
      }
      await exited();
      assert.doesNotMatch(stderr(), /shown once|first run/, 'shown once: not again');
    });
  });
}
