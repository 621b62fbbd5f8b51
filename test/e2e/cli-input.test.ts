import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { childEnv } from '../helpers/built.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds, itOnPostgres } from '../helpers/db.ts';
import { call, connectHttp, ROOT, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

/** What a refused command must leave as it was. */
async function snapshot(server: TestServer) {
  const knex = server.sql;
  const count = async (table: string) => Number((await knex(table).count({ n: '*' }).first())!.n);
  const rl = (await knex('agents').where({ name: 'rl' }).first()) as { rate_limit_per_min: number | null };
  return {
    rate_limit: rl.rate_limit_per_min,
    agents: await count('agents'),
    users: await count('users'),
    audit: await count('audit_events'),
  };
}

/** Whether the terminal that `script` (by pid) runs its command on echoes what is typed, as stty(1) says. */
function echoes(scriptPid: number): boolean {
  const [command] = fs.readFileSync(`/proc/${scriptPid}/task/${scriptPid}/children`, 'utf8').split(' ');
  const tty = fs.readlinkSync(`/proc/${command}/fd/0`);
  return spawnSync('stty', ['-a', '-F', tty])
    .stdout.toString()
    .split(/[\s;]+/)
    .includes('echo');
}

/** [command line, the option its refusal must name] */
const INVALID: [string[], string][] = [
  [['agent', 'set', 'rl', '--rate-limit', 'abc'], '--rate-limit'],
  [['agent', 'set', 'rl', '--rate-limit', '0'], '--rate-limit'],
  [['agent', 'add', 'x', '--rate-limit', 'abc'], '--rate-limit'],
  [['agent', 'add', 'x', '--rate-limit', '1.5'], '--rate-limit'],
  [['agent', 'set', 'rl', '--profile', 'nope'], '--profile'],
  [['agent', 'add', 'x', '--profile', 'nope'], '--profile'],
  [['user', 'add', 'u', '--role', 'king'], '--role'],
  [['user', 'add', 'u', '--role', 'chair,king'], '--role'],
  [['audit', 'export', '--format', 'xml'], '--format'],
  [['audit', 'export', '--format', 'csv', '--since', 'yesterday'], '--since'],
  [['audit', 'export', '--format', 'csv', '--until', '2026-13-01'], '--until'],
  [['audit', 'export', '--format', 'csv', '--result', 'maybe'], '--result'],
  [['audit', 'export', '--format', 'csv', '--kind', 'tool.nope'], '--kind'],
  [['approvals', 'list', '--as', 'x', '--status', 'nope'], '--status'],
];

for (const kind of databaseKinds()) {
  describe(`CLI input on ${kind}`, () => {
    let server: TestServer;
    let tmp: string;

    before(async () => {
      server = await startTestServer(kind);
      tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-cli-input-'));
      const added = await runCli(['agent', 'add', 'rl', '--rate-limit', '5'], server.env);
      assert.equal(added.code, 0, added.stderr);
      const client = await connectHttp(server.url, server.demoToken); // some audit rows to export
      await call(client, 'isphere_search_contacts', { query: 'alice' });
      await client.close();
    });
    after(async () => {
      await server?.stop();
      fs.rmSync(tmp, { recursive: true, force: true });
    });

    it('refuses every invalid option value with exit 2, naming the option, changing nothing', async () => {
      const before = await snapshot(server);
      assert.equal(before.rate_limit, 5);
      for (const [args, option] of INVALID) {
        const res = await runCli(args, server.env, { input: 'a long enough password\n' });
        assert.equal(res.code, 2, `${args.join(' ')}: ${res.stderr}`);
        assert.ok(res.stderr.includes(option), `${args.join(' ')} names ${option}: ${res.stderr}`);
      }
      assert.deepEqual(await snapshot(server), before);
      const profile = await runCli(['agent', 'set', 'rl', '--profile', 'nope'], server.env);
      assert.match(profile.stderr, /installed: .*readonly/);
    });

    it('still accepts "default" for agent set --rate-limit', async () => {
      const res = await runCli(['agent', 'set', 'rl', '--rate-limit', 'default'], server.env);
      assert.equal(res.code, 0, res.stderr);
      assert.equal((await snapshot(server)).rate_limit, null);
      assert.equal((await runCli(['agent', 'set', 'rl', '--rate-limit', '5'], server.env)).code, 0);
    });

    it('export -o: format from the extension, an existing file refused without --force', async () => {
      const csv = path.join(tmp, 'log.csv');
      const first = await runCli(['audit', 'export', '-o', csv], server.env);
      assert.equal(first.code, 0, first.stderr);
      assert.match(fs.readFileSync(csv, 'utf8'), /^"?seq"?,/);
      const kept = fs.readFileSync(csv, 'utf8');

      const again = await runCli(['audit', 'export', '-o', csv], server.env);
      assert.equal(again.code, 2);
      assert.match(again.stderr, /--force/);
      assert.equal(fs.readFileSync(csv, 'utf8'), kept);
      const forced = await runCli(['audit', 'export', '-o', csv, '--force'], server.env);
      assert.equal(forced.code, 0, forced.stderr);

      const mismatch = await runCli(
        ['audit', 'export', '-o', path.join(tmp, 'a.jsonl'), '--format', 'csv'],
        server.env,
      );
      assert.equal(mismatch.code, 2);
      assert.match(mismatch.stderr, /--format/);
      const unknown = await runCli(['audit', 'export', '-o', path.join(tmp, 'a.txt')], server.env);
      assert.equal(unknown.code, 2);
      assert.match(unknown.stderr, /--output/);
      assert.ok(!fs.existsSync(path.join(tmp, 'a.jsonl')) && !fs.existsSync(path.join(tmp, 'a.txt')));
    });
  });
}

describe('CLI command line and environment', () => {
  it('calls an unknown command unknown and lists the commands, exit 2', async () => {
    const res = await runCli(['frobnicate'], { LOG_LEVEL: 'silent' });
    assert.equal(res.code, 2);
    assert.match(res.stderr, /unknown command 'frobnicate'/);
    assert.match(res.stderr, /agent/);
  });

  it('refuses a missing data directory for reading commands, creating nothing', async () => {
    const missing = path.join(os.tmpdir(), `countersign-missing-${process.pid}`);
    const env = { COUNTERSIGN_DATA_DIR: missing, COUNTERSIGN_PASSWORD: 'whatever', LOG_LEVEL: 'silent' };
    for (const args of [
      ['agent', 'list'],
      ['audit', 'export', '--format', 'jsonl'],
      ['audit', 'verify', '--db'],
      ['approvals', 'list', '--as', 'x'],
      ['approvals', 'show', 'some-id', '--as', 'x'],
    ]) {
      const res = await runCli(args, env);
      assert.equal(res.code, 1, `${args.join(' ')}: ${res.stderr}`);
      assert.ok(res.stderr.includes(missing), res.stderr);
      assert.ok(!fs.existsSync(missing), `${args.join(' ')} created ${missing}`);
    }
  });

  it('reports an unreachable PostgreSQL in one line naming host:port', async () => {
    const res = await runCli(['agent', 'list'], {
      DATABASE_URL: 'postgres://postgres@127.0.0.1:1/x',
      LOG_LEVEL: 'silent',
    });
    assert.equal(res.code, 1);
    assert.match(res.stderr, /not reachable at 127\.0\.0\.1:1/);
    assert.doesNotMatch(res.stderr, /\n\s+at /);
  });

  itOnPostgres('reports a missing database and a refused login in one line each', async () => {
    const url = new URL(process.env.TEST_DATABASE_URL!);
    url.pathname = '/countersign_no_such_db';
    const res = await runCli(['agent', 'list'], { DATABASE_URL: url.href, LOG_LEVEL: 'silent' });
    assert.equal(res.code, 1);
    assert.match(res.stderr, /database "countersign_no_such_db" does not exist.*createdb/);
    assert.doesNotMatch(res.stderr, /\n\s+at /);
    const who = new URL(process.env.TEST_DATABASE_URL!);
    who.username = 'countersign_no_such_user';
    const auth = await runCli(['agent', 'list'], { DATABASE_URL: who.href, LOG_LEVEL: 'silent' });
    assert.equal(auth.code, 1);
    assert.match(auth.stderr, /authentication failed/);
    assert.doesNotMatch(auth.stderr, /\n\s+at /);
  });

  const hasScript = spawnSync('script', ['--version']).status === 0;
  it(
    'reads a password from a terminal without echoing it',
    { skip: hasScript ? false : 'needs script(1) (util-linux) for a terminal' },
    async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-tty-'));
      const cli = `'${process.execPath}' --import tsx src/cli.ts user add tty-user --role chair`;
      // `script` gives the command a pseudo-terminal. The password is typed once the prompt is shown
      // and the terminal has stopped echoing: typed before, it would be echoed whatever the CLI does.
      const child = spawn('script', ['-qec', cli, '/dev/null'], {
        cwd: ROOT,
        env: childEnv({ COUNTERSIGN_DATA_DIR: dir, LOG_LEVEL: 'silent' }),
      });
      const closed = new Promise<number | null>((resolve) => child.on('close', resolve));
      let screen = '';
      child.stdout.on('data', (c: Buffer) => (screen += c.toString()));
      await waitFor('the password prompt, echo off', async () =>
        screen.includes('password') && !echoes(child.pid!) ? true : undefined,
      );
      child.stdin.write('typed-secret-123\r');
      const code = await closed;
      fs.rmSync(dir, { recursive: true, force: true });
      assert.equal(code, 0, screen);
      assert.match(screen, /user "tty-user" created/);
      assert.ok(!screen.includes('typed-secret-123'), `the password was echoed: ${screen}`);
    },
  );
});
