/**
 * The README walked top to bottom as a newcomer walks it (issue 44, "Done when"), with the README's own
 * commands and values read out of README.md, so that a README change that breaks the walk fails here:
 *
 *  1. Quick start: a fresh clone, `npm install && npm start`, and the first-run logins it prints.
 *  2. Claude Desktop: the README's `agent add … --config claude-desktop`, and the config block it prints
 *     started as Claude Desktop starts it while `npm start` runs: it joins that server. Over it, with
 *     the SDK's stdio client, the agent finds David and drafts a message to him (dry run).
 *  3. The chair signs in from the review link in Chromium and approves; the agent reads the approval_id
 *     with isphere_get_approval and executes over stdio. Then the same over Streamable HTTP, as the
 *     README's "Any Streamable HTTP client" says: the endpoint, the demo token as a bearer token.
 *  4. Compliance: the README's `audit export`, `audit key` and `audit verify --pubkey`: valid, pinned,
 *     holding both writes under their agents' names; and `audit verify --db` on the live table.
 *  5. A task on both protocol revisions with the documented helper (examples/send-as-task.ts, which
 *     wraps examples/task-client.ts), the chair approving each in Chromium from the queue.
 *
 * What stands in for what, and what is not walked:
 *  - "Fresh clone": the checkout's tracked files (`git ls-files`, as they are in the working tree, so an
 *    uncommitted README or source edit is walked too) copied into a new directory; its `./data` is new.
 *  - "npm install": node_modules symlinked from this checkout. An install needs the network and
 *    minutes, and this checkout's (CI's `npm ci`) is of the same lockfile. `npm start` itself runs in the
 *    copy, through npm, its prestart build included.
 *  - Port 0, not 8787: test files run three at a time and a developer's own server may hold 8787. After
 *    the banner everything goes to the URLs it printed; the README's 8787 is compared up to the port.
 *  - Claude Desktop itself — its config file, its restart, its logs (the README's steps 2–4) — cannot be
 *    automated here: there is no Claude Desktop on a CI machine. The walk starts what the printed block
 *    says (command, args, env) from a working directory elsewhere, with no more of this process's
 *    environment than the SDK's stdio client passes on (HOME, PATH, …), as Claude Desktop does.
 *  - `claude mcp add --transport http …` (Claude Code) is not run: no Claude Code here either. The SDK's
 *    Streamable HTTP client is given the endpoint and the header that command would give.
 *  - PGlite only, the README's default: the walk is a newcomer's first hour; every PostgreSQL path has
 *    its own suites. Skipped without Chromium except under CI=true, as every browser suite is.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import type { Client } from '@modelcontextprotocol/client';
import type { Browser, Page } from 'playwright-core';
import { childEnv } from '../helpers/built.ts';
import { launchChromium, withoutChromium } from '../helpers/chromium.ts';
import type { CliResult } from '../helpers/cli.ts';
import { call, connectHttp, newClient, ROOT, waitFor, type Envelope } from '../helpers/server.ts';
import { runTaskExample, TASK_EXAMPLE } from '../helpers/tasks-client.ts';

const README = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');

/** The text under the heading `title` (any level), up to the next heading of its level or higher. */
function section(title: string): string {
  const lines = README.split('\n');
  // Lines in fenced blocks are never headings (the audit log's sample output starts with `# `).
  let fenced = false;
  const level = lines.map((l) => {
    if (l.startsWith('```')) fenced = !fenced;
    return !fenced && /^#+ /.test(l) ? /^#+/.exec(l)![0].length : 0;
  });
  const start = lines.findIndex((l, i) => level[i]! > 0 && l.replace(/^#+ /, '') === title);
  assert.ok(start >= 0, `README.md has a section "${title}"`);
  const end = level.findIndex((n, i) => i > start && n > 0 && n <= level[start]!);
  return lines.slice(start + 1, end < 0 ? undefined : end).join('\n');
}

/** The fenced code blocks of `text` whose info string is `lang` ('' for none). */
const fences = (text: string, lang: string): string[] =>
  [...text.matchAll(/^```(\S*)\n([\s\S]*?)\n```$/gm)].filter((m) => m[1] === lang).map((m) => m[2]!);

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/**
 * A README line of sample output as a pattern: numbers any numbers (a plural after one may be singular:
 * "21 checkpoints" reads "1 checkpoint" on a small log), `…` and the hex before it anything.
 */
const sampleLine = (line: string) =>
  new RegExp(
    line
      .split(/([0-9a-f]*…|\d+)/)
      .map((piece, i, all) => {
        if (i % 2 === 1) return piece.endsWith('…') ? '\\S*' : '\\d+';
        const afterNumber = i > 0 && !all[i - 1]!.endsWith('…');
        return afterNumber ? escape(piece).replace(/^ ([a-z]+)s\b/, ' $1s?') : escape(piece);
      })
      .join(''),
    'm',
  );

/** A command line of the README split as a shell would split it here (no quotes in these). */
const words = (command: string) => command.trim().split(/\s+/);

/** The copy's `node bin/countersign.js …`: the README's "Command line" way to run `countersign` in a checkout. */
function countersign(copy: string, args: string[]): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(copy, 'bin', 'countersign.js'), ...args], {
      cwd: copy,
      env: childEnv({ HOME: os.homedir() }),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** Signs in as the chair if the page asks, approves the request on it, and waits for the page to say so. */
async function approveHere(page: Page, chair: { name: string; password: string }) {
  if (new URL(page.url()).pathname === '/login') {
    await page.getByLabel('User name').fill(chair.name);
    await page.getByLabel('Password').fill(chair.password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.waitForURL(/\/approvals\/[^/?]+$/);
  }
  await page.getByRole('button', { name: 'Approve' }).click();
  await page.waitForURL('**?done=approved');
  // A task's write may already have run by the time the page answers (the task runner executes it).
  assert.match(await page.getByRole('status').innerText(), /approved|succeeded/);
}

/** Drafts a message to `target` (dry run, the default), as the README's "Writing" step 1. */
async function draft(agent: Client, target: string, text: string): Promise<Envelope> {
  const args = { target_type: 'contact', target_id: target, content_text: text };
  const planned = await call(agent, 'isphere_send_message', args);
  assert.equal(planned.ok, true, JSON.stringify(planned));
  assert.equal(planned.send_status, 'planned');
  assert.equal(planned.approval.status, 'pending');
  return planned;
}

/** Step 3 of "Writing": the approval_id read with isphere_get_approval, the same call with it. */
async function execute(agent: Client, planned: Envelope, target: string, text: string) {
  const got = await call(agent, 'isphere_get_approval', {
    approval_request_id: planned.approval.approval_request_id,
  });
  assert.equal(got.approval.status, 'approved', JSON.stringify(got));
  const sent = await call(agent, 'isphere_send_message', {
    target_type: 'contact',
    target_id: target,
    content_text: text,
    dry_run: false,
    approval_id: got.approval.approval_id,
  });
  assert.equal(sent.ok, true, JSON.stringify(sent));
  assert.equal(sent.send_status, 'sent');
}

describe('the README, walked by a newcomer', { skip: withoutChromium, timeout: 300_000 }, () => {
  let copy: string;
  let npmStart: ChildProcess | undefined;
  let startErr = '';
  let browser: Browser | undefined;
  let page: Page;
  /** What the first-run banner printed. */
  let first: { base: string; mcp: string; token: string; chair: { name: string; password: string } };

  before(async () => {
    // A fresh clone: the tracked files, a new directory, no data/, no dist/.
    copy = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'cs-readme-walk-')));
    const listed = spawnSync('git', ['ls-files', '-z'], { cwd: ROOT, encoding: 'utf8' });
    assert.equal(listed.status, 0, `git ls-files: ${listed.stderr}`);
    for (const file of listed.stdout.split('\0').filter(Boolean)) {
      const from = path.join(ROOT, file);
      if (!fs.existsSync(from)) continue; // deleted in the working tree, not yet committed
      fs.mkdirSync(path.dirname(path.join(copy, file)), { recursive: true });
      fs.copyFileSync(from, path.join(copy, file));
    }
    // The Quick start's two set-up commands: `npm install` stood in (see the header), `npm start` run.
    const setup = fences(section('Quick start'), 'sh')[0]!;
    assert.equal(setup, 'npm install && npm start');
    const [install, start] = setup.split('&&').map(words);
    assert.deepEqual(install, ['npm', 'install']);
    fs.symlinkSync(fs.realpathSync(path.join(ROOT, 'node_modules')), path.join(copy, 'node_modules'));
    // Its own process group, so that npm, its shell and the server stop together.
    npmStart = spawn(start![0]!, start!.slice(1), {
      cwd: copy,
      detached: true,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: childEnv({ HOME: os.homedir(), COUNTERSIGN_PORT: '0', npm_config_update_notifier: 'false' }),
    });
    npmStart.stderr!.on('data', (c: Buffer) => (startErr += c.toString()));
    await waitFor(
      'npm start to print its first-run banner',
      async () => {
        if (npmStart!.exitCode !== null) throw new Error(`npm start exited: ${startErr}`);
        return /admin and compliance login/.test(startErr) ? true : undefined;
      },
      150_000,
    );
    browser = await launchChromium();
    page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  });

  after(async () => {
    await browser?.close();
    const group = npmStart?.pid;
    if (group !== undefined) {
      try {
        process.kill(-group, 'SIGTERM');
      } catch {
        // already gone
      }
      await waitFor(
        'npm start and its server to stop',
        async () => {
          try {
            process.kill(-group, 0);
            return undefined;
          } catch {
            return true;
          }
        },
        30_000,
      ).catch(() => process.kill(-group, 'SIGKILL'));
    }
    if (copy) fs.rmSync(copy, { recursive: true, force: true });
  });

  it('prints the first-run banner the Quick start shows, with a login for every role', () => {
    const sample = fences(section('Quick start'), '').find((b) => b.startsWith('countersign: first run'));
    assert.ok(sample, "the Quick start's banner");
    for (const line of sample.split('\n')) {
      const pattern = new RegExp(
        `^${escape(line)
          .replaceAll('…', '\\S+')
          .replaceAll(escape('127.0.0.1:8787'), escape('127.0.0.1:') + '\\d+')}$`,
        'm',
      );
      assert.match(startErr, pattern);
    }
    const mcp = /MCP endpoint: (\S+)/.exec(startErr)![1]!;
    const chair = /chair login \(shown once\): (\S+) \/ (\S+)/.exec(startErr)!;
    first = {
      base: new URL(mcp).origin,
      mcp,
      token: /demo agent token \(shown once\): (\S+)/.exec(startErr)![1]!,
      chair: { name: chair[1]!, password: chair[2]! },
    };
    assert.ok(fs.existsSync(path.join(copy, 'data', 'outbound')), 'data/outbound/ made on the first start');
  });

  it("joins the running server with Claude Desktop's stdio command and drafts, approves in Chromium and executes over it", async () => {
    const claude = section('Claude Desktop (stdio)');
    // 1. Make the config block, with the README's command, in the checkout, while npm start runs.
    const [command] = fences(claude, 'sh');
    const argv = words(command!);
    assert.deepEqual(argv.slice(0, 2), ['node', 'bin/countersign.js']);
    const added = await countersign(copy, argv.slice(2));
    assert.equal(added.code, 0, added.stderr);
    type Block = {
      mcpServers: { countersign: { command: string; args: string[]; env: Record<string, string> } };
    };
    const block = (JSON.parse(added.stdout) as Block).mcpServers.countersign;
    // The same shape as the README's sample, with this checkout's paths and node by its absolute path.
    const [sample] = fences(claude, 'json');
    const shown = (JSON.parse(sample!) as Block).mcpServers.countersign;
    assert.ok(path.isAbsolute(block.command) && fs.existsSync(block.command), block.command);
    assert.equal(path.basename(block.command), path.basename(shown.command));
    assert.equal(block.args[0], path.join(copy, 'bin', 'countersign.js'));
    assert.ok(shown.args[0]!.endsWith('/bin/countersign.js'));
    assert.deepEqual(block.args.slice(1), shown.args.slice(1));
    for (const key of Object.keys(shown.env)) assert.ok(key in block.env, `the block sets ${key}`);
    for (const key of Object.keys(block.env).filter((k) => !(k in shown.env)))
      assert.match(key, /^(COUNTERSIGN_CONFIG|DATABASE_URL)$/, 'added only when set, as the README says');
    assert.equal(block.env.COUNTERSIGN_DATA_DIR, path.join(copy, 'data'));

    // 3. Claude Desktop starts it: that command, those arguments, that environment, from elsewhere.
    const transport = new StdioClientTransport({
      command: block.command,
      args: block.args,
      env: block.env,
      cwd: os.tmpdir(),
      stderr: 'pipe',
    });
    let stderr = '';
    transport.stderr?.on('data', (c: Buffer) => (stderr += c.toString()));
    const agent = newClient();
    await agent.connect(transport);
    try {
      // It joined the server npm start runs: the README's words, that server's endpoint.
      const joined = sampleLine(
        /\(`(joined the running server \(pid …\): relaying this\nstdio connection to [^`]+)`/
          .exec(claude)![1]!
          .replace('\n', ' '),
      );
      assert.match(stderr, joined);
      assert.ok(stderr.includes(`relaying this stdio connection to ${first.mcp}`), stderr);

      // A newcomer finds David first (the Tools table's search), then drafts to him.
      const found = await call(agent, 'isphere_search_contacts', { query: 'David' });
      assert.equal(found.ok, true, JSON.stringify(found));
      const david = found.contacts[0].contact_id as string;
      const text = 'Hello David, from Claude Desktop over stdio';
      const planned = await draft(agent, david, text);
      // The review link is the running server's web form: the chair opens it in Chromium.
      assert.ok(
        planned.approval.review_url.startsWith(`${first.base}/approvals/`),
        planned.approval.review_url,
      );
      await page.goto(planned.approval.review_url);
      assert.equal(new URL(page.url()).pathname, '/login', 'a visitor is sent to sign in first');
      await approveHere(page, first.chair);
      await execute(agent, planned, david, text);
    } finally {
      await agent.close();
    }
  });

  it('drafts, approves in Chromium and executes over Streamable HTTP with the demo token', async () => {
    const http = section('Any Streamable HTTP client');
    const endpoint = /The endpoint is `([^`]+)`; authenticate with the agent token as a bearer token/.exec(
      http,
    );
    assert.ok(endpoint, 'the README names the endpoint');
    assert.equal(new URL(endpoint[1]!).pathname, new URL(first.mcp).pathname);
    assert.match(fences(http, 'sh')[0]!, /--header "Authorization: Bearer cs_…"/);
    // helpers/server.ts's client: that path on the banner's server, `Authorization: Bearer <token>`.
    const agent = await connectHttp(first.base, first.token);
    try {
      const found = await call(agent, 'isphere_search_contacts', { query: 'David' });
      const david = found.contacts[0].contact_id as string;
      const text = 'Hello David, from an agent over HTTP';
      const planned = await draft(agent, david, text);
      await page.goto(planned.approval.review_url);
      await approveHere(page, first.chair);
      await execute(agent, planned, david, text);
    } finally {
      await agent.close();
    }
  });

  it("exports the audit log and verifies it offline with the server's key pinned, as compliance does", async () => {
    const lines = fences(section('The audit log'), 'sh')[0]!.split('\n');
    const commandAt = (prefix: string) => {
      const at = lines.findIndex((l) => l.startsWith(prefix));
      assert.ok(at >= 0, `the README gives \`${prefix}\``);
      return at;
    };
    const args = (at: number) => words(lines[at]!.replace(/#.*$/, '')).slice(1);
    const exportArgs = args(commandAt('countersign audit export --format jsonl -o '));
    const exported = await countersign(copy, exportArgs);
    assert.equal(exported.code, 0, exported.stderr);
    const file = exportArgs.at(-1);
    assert.ok(
      fs.existsSync(path.join(copy, file!)) && fs.existsSync(path.join(copy, `${file}.manifest.json`)),
    );
    // `countersign audit key > audit-key.pem`: stdout into the file.
    const keyArgs = args(commandAt('countersign audit key >'));
    const key = await countersign(copy, keyArgs.slice(0, keyArgs.indexOf('>')));
    assert.equal(key.code, 0, key.stderr);
    fs.writeFileSync(path.join(copy, keyArgs.at(-1)!), key.stdout);

    const at = commandAt(`countersign audit verify ${file} --pubkey `);
    const verified = await countersign(copy, args(at));
    assert.equal(verified.code, 0, verified.stdout + verified.stderr);
    // What the README says it prints, the comment lines under the command.
    const said: string[] = [];
    for (const line of lines.slice(at + 1)) {
      if (!line.startsWith('# ')) break;
      said.push(line.slice(2));
    }
    assert.ok(said.length >= 2, 'the README shows what verify prints');
    for (const line of said) assert.match(verified.stdout, sampleLine(line));
    // Both writes are in it, each under its agent: the stdio one on the running server's own log.
    const rows = fs
      .readFileSync(path.join(copy, file!), 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { kind: string; details: { agent_name?: string } });
    const writers = rows.filter((r) => r.kind === 'write.succeeded').map((r) => r.details.agent_name);
    assert.deepEqual(writers.sort(), ['claude-desktop', 'demo']);

    // And the live table, on the host: its first line as the README shows it (the second, rows that
    // follow the last checkpoint, only when some do).
    const live = commandAt('countersign audit verify --db ');
    assert.equal(lines[live]!.replace(/#.*$/, '').trim(), 'countersign audit verify --db');
    const db = await countersign(copy, args(live));
    assert.equal(db.code, 0, db.stdout + db.stderr);
    assert.match(db.stdout, sampleLine(lines[live + 1]!.slice(2)));
  });

  it('runs a task on both protocol revisions with the documented helper, the chair approving in Chromium', async () => {
    const writing = section('Writing: draft, approval, execution');
    const runnable = /`COUNTERSIGN_AGENT_TOKEN=cs_… node ([^`]+)`/.exec(writing);
    assert.ok(runnable, 'the README gives the runnable example');
    const argv = words(runnable[1]!);
    assert.deepEqual(argv.slice(0, TASK_EXAMPLE.length), [...TASK_EXAMPLE]);
    const both = /openTaskClient\([^)]*'([\d-]+)'\); \/\/ or '([\d-]+)'/.exec(writing);
    assert.ok(both, 'the README names both revisions');
    assert.equal(argv[TASK_EXAMPLE.length], both[1]);
    for (const revision of [both[1]!, both[2]!]) {
      const text = `Hello David, asked once as a task (${revision})`;
      // COUNTERSIGN_URL: the example's own header names it; the README's default is port 8787.
      const example = runTaskExample(
        { HOME: os.homedir(), COUNTERSIGN_AGENT_TOKEN: first.token, COUNTERSIGN_URL: first.base },
        revision,
        text,
        copy,
      );
      try {
        await waitFor(
          'the example to say it waits for a chair',
          async () => (/waiting for a chair to decide/.test(example.stderr()) ? true : undefined),
          60_000,
        );
        // The chair finds it in the queue (pending, the only one) and reads what will be sent.
        await page.goto(`${first.base}/approvals`);
        await page
          .getByRole('link', { name: /Review request to/ })
          .first()
          .click();
        assert.equal(await page.locator('pre.content').first().innerText(), text);
        await approveHere(page, first.chair);
        assert.equal(await example.exit, 0, example.stderr());
        const result = JSON.parse(example.stdout()) as {
          structuredContent: { send_status: string; dry_run: boolean };
        };
        assert.equal(result.structuredContent.send_status, 'sent');
        assert.equal(result.structuredContent.dry_run, false);
      } finally {
        example.kill();
      }
    }
  });
});
