import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { childEnv } from '../helpers/built.ts';
import { call, connectHttp, ROOT, waitFor } from '../helpers/server.ts';

/**
 * `npm start` runs the build (dist/), not the sources: everything the server reads at run time —
 * migrations, templates, static files, profiles, package.json — must be found from there too. This
 * builds it and starts it on a fresh embedded database, as a newcomer's first `npm start` does.
 */
describe('the build that npm start runs', () => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-build-'));
  let child: ReturnType<typeof spawn>;
  let stderr = '';

  before(async () => {
    const build = spawn(process.execPath, ['--import', 'tsx', 'scripts/build.ts'], { cwd: ROOT });
    const code = await new Promise<number | null>((resolve) => build.once('exit', resolve));
    assert.equal(code, 0, 'npm run build');
    // Exactly npm start's command: node, its options, dist/cli.js serve.
    const start = (
      JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as {
        scripts: { start: string };
      }
    ).scripts.start.split(/\s+/);
    assert.equal(start[0], 'node');
    child = spawn(process.execPath, start.slice(1), {
      cwd: ROOT,
      env: childEnv({ COUNTERSIGN_DATA_DIR: dataDir, COUNTERSIGN_PORT: '0' }),
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    await waitFor(
      'the first-run banner',
      async () => (/chair login/.test(stderr) ? true : undefined),
      90_000,
    );
  });

  after(async () => {
    child?.kill('SIGTERM');
    if (child && child.exitCode === null) await new Promise((resolve) => child.once('exit', resolve));
    fs.rmSync(dataDir, { recursive: true, force: true });
  });

  const url = () => /MCP endpoint: (http:\/\/\S+)\/mcp/.exec(stderr)![1]!;

  it('migrates a new database from dist/migrations and serves a tool call', async () => {
    const token = /demo agent token \(shown once\): (\S+)/.exec(stderr)![1]!;
    const agent = await connectHttp(url(), token);
    try {
      const res = await call(agent, 'isphere_search_contacts', { query: 'david' });
      assert.equal(res.ok, true, JSON.stringify(res.error));
      assert.ok(res.contacts.length > 0);
    } finally {
      await agent.close();
    }
  });

  it('renders pages from the templates and serves static files', async () => {
    const login = await fetch(new URL('/login', url()));
    assert.equal(login.status, 200);
    assert.match(await login.text(), /<form/);
    const css = await fetch(new URL('/static/app.css', url()));
    assert.equal(css.status, 200);
  });

  it('is started by the systemd unit with the node options of npm start', () => {
    const unit = fs.readFileSync(path.join(ROOT, 'deploy/countersign.service'), 'utf8');
    const exec = /^ExecStart=(\S+) (.*) \/opt\/countersign\/dist\/cli\.js serve$/m.exec(unit);
    assert.ok(exec, 'an ExecStart line running dist/cli.js serve');
    const start = (
      JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } }
    ).scripts.start;
    assert.equal(exec[2], /^node (.*) dist\/cli\.js serve$/.exec(start)?.[1]);
  });

  it('is started by the container image with the node options of npm start, as a user that is not root', () => {
    const file = fs.readFileSync(path.join(ROOT, 'Containerfile'), 'utf8');
    const cmd = /^CMD (\[.*\])$/m.exec(file);
    assert.ok(cmd, 'a CMD in exec form');
    const args = JSON.parse(cmd[1]!) as string[];
    assert.equal(args[0], 'node');
    assert.deepEqual(args.slice(-2), ['/opt/countersign/dist/cli.js', 'serve']);
    const start = (
      JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } }
    ).scripts.start;
    assert.equal(args.slice(1, -2).join(' '), /^node (.*) dist\/cli\.js serve$/.exec(start)?.[1]);
    // The last USER before CMD runs the server: not root, by name or number.
    const users = [...file.matchAll(/^USER (\S+)$/gm)].map((m) => m[1]);
    assert.ok(users.length > 0 && !['root', '0'].includes(users.at(-1)!));
    assert.match(file, /^VOLUME \["\/var\/lib\/countersign"\]$/m);
    assert.match(file, /^ARG BASE_IMAGE=docker\.io\/library\/node:20-slim$/m);
  });

  it('is what bin/countersign.js runs while it is as new as the sources', async () => {
    const bin = spawn(process.execPath, ['bin/countersign.js', 'agent', 'list'], {
      cwd: ROOT,
      env: childEnv({ COUNTERSIGN_DATA_DIR: dataDir }),
    });
    let out = '';
    bin.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    bin.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => bin.once('exit', resolve));
    // The server holds the embedded database: the command goes through its admin endpoint.
    assert.equal(code, 0, out);
    assert.match(out, /demo/);
  });

  it('reports the package version', async () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };
    const health = (await (await fetch(new URL('/healthz', url()))).json()) as { version: string };
    assert.equal(health.version, pkg.version);
  });

  it('builds again only when what it is built from changed (npm start runs it every time)', async () => {
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-build-out-'));
    const build = async (...args: string[]) => {
      const child = spawn(process.execPath, ['--import', 'tsx', 'scripts/build.ts', '--out', out, ...args], {
        cwd: ROOT,
      });
      let err = '';
      child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
      const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
      assert.equal(code, 0, err);
      return { said: err, cli: fs.statSync(path.join(out, 'cli.js')).mtimeMs };
    };
    try {
      const first = await build();
      assert.match(first.said, /^built .*cli\.js and \d+ migrations$/m);
      const again = await build();
      assert.match(again.said, /is up to date with the sources/);
      assert.equal(again.cli, first.cli, 'nothing rewritten');
      // A build made from other sources (its fingerprint differs) is replaced, as is one asked for.
      fs.writeFileSync(path.join(out, '.built-from'), 'from other sources\n');
      const changed = await build();
      assert.match(changed.said, /^built /m);
      assert.ok(changed.cli > first.cli);
      const forced = await build('--force');
      assert.match(forced.said, /^built /m);
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  });
});
