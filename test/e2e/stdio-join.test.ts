import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { builtCli, childEnv } from '../helpers/built.ts';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { runCli } from '../helpers/cli.ts';
import { framed } from '../helpers/tasks-client.ts';
import {
  call,
  connectStdio,
  ERAS,
  newClient,
  ROOT,
  startTestServer,
  testEnv,
  waitFor,
  type TestServer,
} from '../helpers/server.ts';

const DRAFT = { target_type: 'contact', target_id: 'ct_david' } as const;

/**
 * `countersign serve --stdio` as a child spoken to in raw JSON-RPC lines: what it answers, what it says
 * on stderr, and how it exits.
 */
async function rawStdio(env: Record<string, string>) {
  const child = spawn(process.execPath, [await builtCli(), 'serve', '--stdio'], {
    cwd: ROOT,
    env: childEnv(env),
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const exit = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const messages = () =>
    stdout
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  return {
    /** Closes stdin, as a client that is done does. */
    end: () => child.stdin.end(),
    send: (message: object) => child.stdin.write(`${JSON.stringify(message)}\n`),
    /** Every message on stdout so far. */
    messages,
    /** The answer to request `id`, once it is on stdout. */
    async answer(id: number): Promise<Record<string, unknown>> {
      for (let i = 0; i < 600; i++) {
        const line = messages().find((m) => m.id === id && !('method' in m));
        if (line) return line;
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error(`no answer to ${id}; stderr: ${stderr}`);
    },
    exit,
    stderr: () => stderr,
    kill: () => child.kill('SIGKILL'),
  };
}

/** `node bin/countersign.js ARGS`, the command a checkout's README names, run to its end. */
async function runBin(args: string[], env: Record<string, string>) {
  const child = spawn(process.execPath, [path.join(ROOT, 'bin', 'countersign.js'), ...args], {
    cwd: ROOT,
    env: childEnv(env),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  return { code, stdout, stderr };
}

const INITIALIZE = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
};

for (const kind of databaseKinds()) {
  describe(`serve --stdio beside a running server on ${kind}`, () => {
    let server: TestServer;
    let token: string;
    let chair: User;
    const joins = kind === 'pglite';

    before(async () => {
      server = await startTestServer(kind);
      token = await server.addAgent('claude-desktop');
      chair = await createUser(server.sql, {
        name: 'chair-ada',
        roles: ['chair'],
        password: 'correct horse 1',
      });
    });
    after(async () => server?.stop());

    for (const era of ERAS) {
      it(`serves a write drafted, approved and executed through stdio, on the running server's audit log (${era} client)`, async () => {
        const { client, stderr, exited } = await connectStdio(
          { ...server.env, COUNTERSIGN_AGENT_TOKEN: token },
          era,
        );
        try {
          assert.equal(client.getProtocolEra(), era);
          const text = `through stdio, ${era}`;
          const draft = await call(client, 'isphere_send_message', { ...DRAFT, content_text: text });
          assert.equal(draft.ok, true, JSON.stringify(draft));
          const approvalId = await approveAsChair(
            { approvals: server.services.approvals, user: chair },
            draft,
          );
          const sent = await call(client, 'isphere_send_message', {
            ...DRAFT,
            content_text: text,
            dry_run: false,
            approval_id: approvalId,
          });
          assert.equal(sent.ok, true, JSON.stringify(sent));
          const rows = await server
            .sql('audit_events')
            .where({ approval_id: approvalId })
            .select('kind', 'agent_id', 'details');
          const executed = rows.find((r) => r.kind === 'write.succeeded');
          assert.ok(executed, JSON.stringify(rows));
          const details =
            typeof executed.details === 'string' ? JSON.parse(executed.details) : executed.details;
          assert.equal(details.agent_name, 'claude-desktop');
          const messages = await server
            .sql('messages')
            .where({ direction: 'outgoing', content_text: text })
            .count({ n: '*' })
            .first();
          assert.equal(Number(messages?.n), 1);
          // Which mode it is in is said on stderr; stdout carried the JSON-RPC untouched.
          if (joins) assert.match(stderr(), /joined the running server \(pid \d+\): relaying .*\/mcp/);
          else assert.match(stderr(), /stdio serves the PostgreSQL database of DATABASE_URL itself/);
        } finally {
          await client.close();
        }
        await exited();
      });
    }

    // Only the embedded database is joined (on PostgreSQL stdio serves the database itself).
    if (joins)
      it('relays a 2026-07-28 task, the listen stream the server pushes its changes on, and its cancellation', async () => {
        const relay = await rawStdio({ ...server.env, COUNTERSIGN_AGENT_TOKEN: token });
        try {
          const text = 'a task through the relay';
          relay.send({
            jsonrpc: '2.0',
            id: 1,
            ...framed('tools/call', {
              name: 'isphere_send_message',
              arguments: { ...DRAFT, content_text: text, dry_run: false },
            }),
          });
          const created = (await relay.answer(1)) as { result?: { resultType?: string; taskId?: string } };
          assert.equal(created.result?.resultType, 'task', JSON.stringify(created));
          const taskId = created.result!.taskId!;
          // Server-to-client messages: the listen stream's notifications come out on stdout as they come.
          relay.send({
            jsonrpc: '2.0',
            id: 2,
            ...framed('subscriptions/listen', { notifications: { taskIds: [taskId] } }),
          });
          const noteOf = (status: string) =>
            waitFor(`notifications/tasks ${status}`, async () =>
              relay
                .messages()
                .find(
                  (m) =>
                    m.method === 'notifications/tasks' &&
                    (m.params as { taskId?: string; status?: string }).taskId === taskId &&
                    (m.params as { status?: string }).status === status,
                ),
            );
          await noteOf('working');
          const request = (await server
            .sql('approval_tasks')
            .where({ id: taskId })
            .first('approval_request_id')) as { approval_request_id: string };
          await server.services.approvals.decide({
            id: request.approval_request_id,
            user: chair,
            decision: 'approve',
          });
          await noteOf('completed');
          // Cancelled by the client: the stream's POST is aborted, and the server lets it go.
          relay.send({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 2 } });
          relay.send({ jsonrpc: '2.0', id: 3, ...framed('tasks/get', { taskId }) });
          const got = (await relay.answer(3)) as { result?: { status?: string } };
          assert.equal(got.result?.status, 'completed', JSON.stringify(got));
          assert.equal(
            relay.messages().filter((m) => m.id === 2 && 'result' in m).length,
            0,
            'a cancelled request is not answered',
          );
          relay.end();
          assert.equal(await relay.exit, 0, relay.stderr());
        } finally {
          relay.kill();
        }
      });

    it('refuses a bad token at start as a direct stdio server does, and the running server records it', async () => {
      const res = await runCli(['serve', '--stdio'], { ...server.env, COUNTERSIGN_AGENT_TOKEN: 'cs_wrong' });
      assert.equal(res.code, 1);
      assert.match(res.stderr, /COUNTERSIGN_AGENT_TOKEN refused: unknown token/);
      assert.equal(res.stdout, '');
      const denied = await server.sql('audit_events').where({ kind: 'auth.denied' }).count({ n: '*' });
      assert.ok(Number(denied[0]?.n) > 0);
    });

    it('passes a revoked token on as the refusal of that request, as a direct stdio server answers it', async () => {
      const revokedToken = await server.addAgent('soon-revoked');
      const relay = await rawStdio({ ...server.env, COUNTERSIGN_AGENT_TOKEN: revokedToken });
      try {
        relay.send(INITIALIZE);
        assert.ok('result' in (await relay.answer(1)));
        relay.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
        const revoked = await runCli(['agent', 'revoke', 'soon-revoked'], server.env);
        assert.equal(revoked.code, 0, revoked.stderr);
        relay.send({ jsonrpc: '2.0', id: 2, method: 'tools/list' });
        const answer = (await relay.answer(2)) as { error?: { code: number; message: string } };
        assert.equal(answer.error?.code, -32600, JSON.stringify(answer));
        assert.match(answer.error!.message, /agent token refused: revoked_token/);
      } finally {
        relay.kill();
      }
    });
  });
}

describe('serve --stdio when the server it joined stops', () => {
  it('ends with a clear message on stderr and a non-zero exit', async () => {
    const server = await startTestServer('pglite');
    let stopped = false;
    try {
      const relay = await rawStdio({ ...server.env, COUNTERSIGN_AGENT_TOKEN: server.demoToken });
      relay.send(INITIALIZE);
      assert.ok('result' in (await relay.answer(1)));
      await server.close();
      stopped = true;
      const code = await relay.exit;
      assert.equal(code, 1);
      assert.match(relay.stderr(), /the running server \(pid \d+\) this stdio connection joined has stopped/);
    } finally {
      if (!stopped) await server.close();
      await server.db.drop();
    }
  });
});

for (const kind of databaseKinds()) {
  describe(`Claude Desktop's config block on ${kind}`, () => {
    let db: TestDatabase;
    after(async () => db?.drop());

    it('agent add --config claude-desktop prints a config that parses and serves the new agent over stdio', async () => {
      db = await createTestDatabase(kind);
      fs.rmSync(path.join(db.dataDir, 'pglite'), { recursive: true, force: true });
      const env = testEnv(db);
      // As the README has it: the checkout's own command.
      const added = await runBin(['agent', 'add', 'claude-desktop', '--config', 'claude-desktop'], env);
      assert.equal(added.code, 0, added.stderr);
      const block = JSON.parse(added.stdout) as {
        mcpServers: { countersign: { command: string; args: string[]; env: Record<string, string> } };
      };
      const entry = block.mcpServers.countersign;
      assert.equal(entry.command, process.execPath, 'node by its absolute path');
      assert.equal(entry.args[0], path.join(ROOT, 'bin', 'countersign.js'));
      assert.deepEqual(entry.args.slice(1), ['serve', '--stdio']);
      assert.match(entry.env.COUNTERSIGN_AGENT_TOKEN!, /^cs_/);
      assert.equal(entry.env.COUNTERSIGN_DATA_DIR, db.dataDir);
      assert.equal(entry.env.DATABASE_URL, db.url);
      assert.match(added.stderr, /claude_desktop_config\.json.*then quit Claude Desktop fully/);

      // Started as Claude Desktop starts it: that command, those arguments, that environment.
      const transport = new StdioClientTransport({
        command: entry.command,
        args: entry.args,
        env: childEnv({ ...env, ...entry.env }),
        cwd: os.tmpdir(),
        stderr: 'pipe',
      });
      const client = newClient();
      await client.connect(transport);
      try {
        const found = await call(client, 'isphere_search_contacts', { query: 'David' });
        assert.equal(found.ok, true, JSON.stringify(found));
      } finally {
        await client.close();
      }
    });
  });
}
