import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { builtinTools } from '../../src/tools/index.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { databaseKinds } from '../helpers/db.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { builtCli, childEnv } from '../helpers/built.ts';
import { runCli } from '../helpers/cli.ts';
import { call, connectStdio, ERAS, newClient, ROOT, testEnv } from '../helpers/server.ts';

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
  });
}
