import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { builtinTools } from '../../src/tools/index.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { databaseKinds } from '../helpers/db.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { builtCli, childEnv } from '../helpers/built.ts';
import { runCli } from '../helpers/cli.ts';
import { call, connectStdio, ERAS, newClient, ROOT, testEnv, waitFor } from '../helpers/server.ts';

/** Something else listening on a loopback port. */
async function occupy(): Promise<{ port: number; close(): Promise<void> }> {
  const blocker = net.createServer();
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
  const { port } = blocker.address() as net.AddressInfo;
  return { port, close: () => new Promise<void>((resolve) => blocker.close(() => resolve())) };
}

/** `countersign serve --stdio --no-web`, driven by the SDK's stdio client (connectStdio takes no options). */
async function connectStdioWithoutWeb(env: Record<string, string>) {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [await builtCli(), 'serve', '--stdio', '--no-web'],
    env: childEnv(env),
    cwd: ROOT,
    stderr: 'pipe',
  });
  let stderr = '';
  transport.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const client = newClient();
  await client.connect(transport);
  return { client, stderr: () => stderr };
}

const DRAFT = { target_type: 'contact', target_id: 'ct_david' } as const;

interface Exported {
  seq: number;
  kind: string;
  agent_id: string | null;
  error_code: string | null;
  details: Record<string, unknown>;
}

/** The whole log, read through an export (what compliance gets). */
async function exported(env: Record<string, string>, dir: string): Promise<Exported[]> {
  const file = path.join(dir, `stdio-${Date.now()}.jsonl`);
  const res = await runCli(['audit', 'export', '-o', file], env);
  assert.equal(res.code, 0, res.stderr);
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Exported);
}

/** The auth.denied rows for `reason` after `sinceSeq`, and the summaries that count more of them. */
function refusalsOf(rows: Exported[], reason: string, sinceSeq = 0) {
  const later = rows.filter((r) => r.seq > sinceSeq);
  const own = later.filter((r) => r.kind === 'auth.denied' && r.details.reason === reason);
  const summaries = later.filter(
    (r) =>
      r.kind === 'auth.denied_summary' && r.details.of_kind === 'auth.denied' && r.details.reason === reason,
  );
  return { own, summaries, summed: summaries.reduce((n, r) => n + Number(r.details.count), 0) };
}

/** The source a stdio server's refusals are counted under: its process, `stdio:<pid>@<host>` (docs/audit.md). */
const assertStdioSource = (ip: unknown) =>
  assert.ok(/^stdio:\d+@/.test(String(ip)) && String(ip).endsWith(`@${os.hostname()}`), String(ip));

for (const kind of databaseKinds()) {
  describe(`stdio transport on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    let token: string;

    before(async () => {
      db = await createTestDatabase(kind);
      env = testEnv(db, { COUNTERSIGN_DEMO: 'false' });
      assert.equal((await runCli(['demo'], env)).code, 0);
      const added = await runCli(['agent', 'add', 'desktop'], env);
      assert.equal(added.code, 0, added.stderr);
      token = added.stdout.trim().split('\n').at(-1)!;
      const chair = await runCli(['user', 'add', 'ada', '--role', 'chair'], env, { input: 'ada password\n' });
      assert.equal(chair.code, 0, chair.stderr);
    });
    after(async () => db?.drop());

    for (const era of ERAS) {
      it(`serves the read tools to the agent named by COUNTERSIGN_AGENT_TOKEN, logging only to stderr (${era} client)`, async () => {
        const { client, stderr, exited } = await connectStdio(
          { ...env, LOG_LEVEL: 'info', COUNTERSIGN_AGENT_TOKEN: token },
          era,
        );
        try {
          assert.equal(client.getProtocolEra(), era);
          const tools = await client.listTools();
          assert.deepEqual(
            tools.tools.map((t) => t.name),
            builtinTools.map((t) => `isphere_${t.name}`),
          );
          const res = await call(client, 'isphere_search_contacts', { query: '张' });
          assert.equal(res.contacts[0].contact_id, 'ct_zhang');
          assert.ok(res.audit.audit_seq > 0);
          // Any log line on stdout would have broken the JSON-RPC stream above; the logs are on stderr.
          assert.match(stderr(), /countersign serving on stdio/);
          assert.ok(!stderr().includes(token), 'the token is never logged');
        } finally {
          await client.close();
        }
        // The client closing stdin ends the server cleanly: nothing but its own log lines on stderr.
        await exited();
        assert.doesNotMatch(stderr(), /Error|Warning|Maximum call stack/);
      });
    }

    it("serves the web form beside stdio: a dry run's review_url answers the chair after sign-in", async () => {
      const { client, stderr, exited } = await connectStdio({ ...env, COUNTERSIGN_AGENT_TOKEN: token });
      try {
        const draft = await call(client, 'isphere_send_message', { ...DRAFT, content_text: 'from stdio' });
        const url = new URL(draft.approval.review_url);
        assert.equal(url.pathname, `/approvals/${draft.approval.approval_request_id}`);
        assert.match(draft.approval.next_step, /in the web form at http:\/\/127\.0\.0\.1:\d+\/approvals\//);
        const web = new WebClient(url.origin);
        const anonymous = await web.get(url.pathname);
        assert.equal(anonymous.res.status, 303, 'the login redirect');
        assert.match(anonymous.res.headers.get('location')!, /^\/login\?next=/);
        assert.equal((await web.login('ada', 'ada password')).res.status, 303);
        const page = await web.get(url.pathname);
        assert.equal(page.res.status, 200);
        assert.match(page.html, /from stdio/);
        assert.equal((await web.get('/healthz')).res.status, 200);
        // The agent is served on stdio: the web port has no MCP endpoint.
        const mcp = await fetch(new URL('/mcp', url.origin), { method: 'POST', body: '{}' });
        assert.equal(mcp.status, 404);
      } finally {
        await client.close();
      }
      await exited();
      assert.doesNotMatch(stderr(), /in use/);
    });

    it('keeps serving MCP when the web port is taken, says so once, and points the chair at the CLI', async () => {
      const blocker = await occupy();
      try {
        const { client, stderr, exited } = await connectStdio({
          ...env,
          COUNTERSIGN_PORT: String(blocker.port),
          COUNTERSIGN_AGENT_TOKEN: token,
        });
        let approvalId: string;
        try {
          const draft = await call(client, 'isphere_send_message', { ...DRAFT, content_text: 'no web form' });
          assert.equal(draft.ok, true);
          const id: string = draft.approval.approval_request_id;
          assert.equal(draft.approval.review_url, null, 'no link to a page nobody serves');
          assert.ok(
            draft.approval.next_step.includes(`countersign approvals approve ${id} --as <chair>`),
            draft.approval.next_step,
          );
          const lines = stderr()
            .split('\n')
            .filter((l) => l.includes('in use'));
          assert.deepEqual(lines, [
            `countersign: port ${blocker.port} is in use; set COUNTERSIGN_PORT or pass --no-web ` +
              '(chairs approve with: countersign approvals approve <id> --as <user>)',
          ]);
          // The command the answer names works while this server runs.
          const approved = await runCli(['approvals', 'approve', id, '--as', 'ada'], {
            ...env,
            COUNTERSIGN_PASSWORD: 'ada password',
          });
          assert.equal(approved.code, 0, approved.stderr);
          approvalId = approved.stdout.trim().split('\n').at(-1)!;
          const sent = await call(client, 'isphere_send_message', {
            ...DRAFT,
            content_text: 'no web form',
            dry_run: false,
            approval_id: approvalId,
          });
          assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
        } finally {
          await client.close();
        }
        await exited();
      } finally {
        await blocker.close();
      }
    });

    it('serves no web form with --no-web, and says where to approve instead', async () => {
      const { client, stderr } = await connectStdioWithoutWeb({ ...env, COUNTERSIGN_AGENT_TOKEN: token });
      try {
        const draft = await call(client, 'isphere_send_message', { ...DRAFT, content_text: 'told no web' });
        assert.equal(draft.approval.review_url, null);
        assert.match(draft.approval.next_step, /countersign approvals approve \S+ --as <chair>/);
        const got = await call(client, 'isphere_get_approval', {
          approval_request_id: draft.approval.approval_request_id,
        });
        assert.equal(got.approval.review_url, null);
        assert.doesNotMatch(stderr(), /in use/, 'nothing to complain about: the web form was turned off');
      } finally {
        await client.close();
      }
    });

    it('exits non-zero with a clear message for a bad token', async () => {
      const res = await runCli(['serve', '--stdio'], { ...env, COUNTERSIGN_AGENT_TOKEN: 'cs_wrong' });
      assert.equal(res.code, 1);
      assert.match(res.stderr, /COUNTERSIGN_AGENT_TOKEN refused: unknown token/);
      assert.equal(res.stdout, '');
      const none = await runCli(['serve', '--stdio'], env);
      assert.equal(none.code, 1);
      assert.match(none.stderr, /missing token/);
    });

    it('records a refused start as HTTP records a refused request, committed before the process exits', async () => {
      const before = (await exported(env, db.dataDir)).at(-1)!.seq;
      const res = await runCli(['serve', '--stdio', '--no-web'], {
        ...env,
        COUNTERSIGN_AGENT_TOKEN: 'cs_wrong',
      });
      assert.equal(res.code, 1);
      const { own, summaries } = refusalsOf(await exported(env, db.dataDir), 'unknown_token', before);
      assert.equal(own.length, 1);
      assert.equal(summaries.length, 0);
      const [row] = own;
      assert.equal(row!.error_code, 'UNAUTHENTICATED');
      assert.equal(row!.agent_id, null);
      assert.deepEqual(Object.keys(row!.details).sort(), ['ip', 'reason', 'transport']);
      assert.equal(row!.details.transport, 'stdio');
      assertStdioSource(row!.details.ip);
    });

    it("counts a revoked token's refusals as HTTP does: a few rows a minute, the rest in a summary", async () => {
      const [perMinute, calls] = [3, 25];
      const added = await runCli(['agent', 'add', 'soon-revoked'], env);
      assert.equal(added.code, 0, added.stderr);
      const revokedToken = added.stdout.trim().split('\n').at(-1)!;
      const before = (await exported(env, db.dataDir)).at(-1)!.seq;
      const { client, exited } = await connectStdio({
        ...env,
        COUNTERSIGN_AGENT_TOKEN: revokedToken,
        COUNTERSIGN_DENIED_ROWS_PER_MINUTE: String(perMinute),
      });
      const refused = /agent token refused: revoked_token/;
      let answered = 0;
      try {
        assert.equal((await runCli(['agent', 'revoke', 'soon-revoked'], env)).code, 0);
        // On PostgreSQL the server hears of the revocation through the database, a moment later.
        await waitFor('the revocation to take effect', () =>
          client.listTools().then(
            () => undefined,
            (err: Error) => {
              assert.match(err.message, refused);
              return ++answered;
            },
          ),
        );
        for (; answered < calls; answered++) await assert.rejects(client.listTools(), refused);
      } finally {
        await client.close(); // a clean stop writes the open minute's summary
      }
      await exited();

      const t = refusalsOf(await exported(env, db.dataDir), 'revoked_token', before);
      assert.equal(t.own.length + t.summed, calls, 'every refusal counted');
      const minutes = new Set(t.summaries.map((r) => r.details.minute_start));
      assert.ok(t.own.length <= perMinute * Math.max(1, minutes.size), `${t.own.length} own rows`);
      assert.ok(t.summaries.length >= 1, 'the rest summed');
      for (const row of t.own) {
        assert.equal(row.error_code, 'UNAUTHENTICATED');
        assert.equal(row.details.transport, 'stdio');
        assert.equal(row.details.agent_name, 'soon-revoked');
        assert.ok(row.agent_id);
      }
      // One source for this process: its own rows and its summaries name the same one.
      const sources = new Set([...t.own, ...t.summaries].map((r) => r.details.ip));
      assert.equal(sources.size, 1);
      assertStdioSource([...sources][0]);
      for (const s of t.summaries) assert.equal(s.details.rows_per_minute, perMinute);
    });
  });
}
