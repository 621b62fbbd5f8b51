import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { parse } from 'csv-parse/sync';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { queryAudit } from '../../src/audit/query.ts';
import type { User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { misnamedAgentRows } from '../helpers/audit-names.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { pinArgs, runCli } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, testEnv, waitFor, type TestServer } from '../helpers/server.ts';

type Exported = { seq: number; kind: string; agent_id: string | null; details: Record<string, unknown> };

/** Every kind a row about an agent can have that the flow below writes. */
const AGENT_KINDS = [
  'tool.call',
  'auth.denied',
  'approval.requested',
  'approval.approved',
  'approval.rejected',
  'approval.expired',
  'write.started',
  'write.succeeded',
  'write.failed',
  'agent.created',
  'agent.profile_changed',
  'agent.rate_limit_changed',
  'agent.token_rotated',
  'agent.revoked',
  'notification.delivered',
  'notification.failed',
];

const message = (content_text: string) => ({ target_type: 'contact', target_id: 'ct_david', content_text });

/** Exports the whole log with the CLI, verifies it offline, and returns its rows as compliance reads them. */
async function exportedRows(env: Record<string, string>, dir: string, format: 'jsonl' | 'csv') {
  const file = path.join(dir, `names-${Date.now()}.${format}`);
  const exported = await runCli(['audit', 'export', '--format', format, '-o', file], env);
  assert.equal(exported.code, 0, exported.stderr);
  const verified = await runCli(['audit', 'verify', file, ...pinArgs(env)], env);
  assert.equal(verified.code, 0, verified.stdout + verified.stderr);
  assert.match(verified.stdout, /(\d+)\/\1 rows valid/);
  const text = fs.readFileSync(file, 'utf8');
  if (format === 'jsonl') {
    return text
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as Exported);
  }
  const records = parse(text, { columns: true }) as Record<string, string>[];
  return records.map((r): Exported => ({
    seq: Number(r.seq),
    kind: r.kind!,
    agent_id: r.agent_id === '' ? null : r.agent_id!,
    details: JSON.parse(r.details!) as Record<string, unknown>,
  }));
}

/** The names of the agents, by id, as the agents table has them. */
async function agentNames(server: TestServer): Promise<Map<string, string>> {
  const rows = (await server.sql('agents').select('id', 'name')) as { id: string; name: string }[];
  return new Map(rows.map((r) => [String(r.id), r.name]));
}

for (const kind of databaseKinds()) {
  describe(`the agent's name in audit rows on ${kind}`, () => {
    let server: TestServer;
    let hook: http.Server;
    let refusalsLeft = 1;
    let demo: Client;
    let chair: User;
    let dir: string;
    const cli = (args: string[]) => runCli(args, server.env);
    const ageRequest = (id: string, change: Record<string, unknown>) =>
      server.sql('approval_requests').where({ id }).update(change);
    const draft = async (text: string, extra: Record<string, unknown> = {}) => {
      const res = await call(demo, 'isphere_send_message', { ...message(text), ...extra });
      assert.equal(res.ok, true, JSON.stringify(res.error));
      return res.approval.approval_request_id as string;
    };

    before(async () => {
      // A webhook that refuses its first notice: notification.failed, then notification.delivered rows.
      hook = http.createServer((req, res) => {
        req.resume();
        req.on('end', () => {
          res.statusCode = refusalsLeft-- > 0 ? 503 : 200;
          res.end();
        });
      });
      await new Promise<void>((r) => hook.listen(0, '127.0.0.1', () => r()));
      server = await startTestServer(kind, {
        COUNTERSIGN_WEBHOOK_URL: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/hook`,
        COUNTERSIGN_WEBHOOK_SECRET: 'a-webhook-secret-of-some-length',
        COUNTERSIGN_NOTIFY_POLL_MS: '100',
        COUNTERSIGN_NOTIFY_BACKOFF_MS: '50',
      });
      chair = await createUser(server.sql, {
        name: 'chair-nm',
        roles: ['chair', 'compliance'],
        password: 'chair-nm password',
      });
      demo = await connectHttp(server.url, server.demoToken);
      dir = fs.mkdtempSync(path.join(server.db.dataDir, 'names-'));
    });
    after(async () => {
      await demo?.close();
      await server?.stop();
      hook?.close();
    });

    it('records the agent of every row by name: calls, approvals, writes, expiries, refusals, commands, notices', async () => {
      // Commands on an agent, at the CLI: add, set, rotate; it is refused a write its profile denies.
      assert.equal((await cli(['agent', 'add', 'scribe', '--profile', 'readonly'])).code, 0);
      assert.equal((await cli(['agent', 'set', 'scribe', '--profile', 'all', '--rate-limit', '30'])).code, 0);
      assert.equal((await cli(['agent', 'set', 'scribe', '--profile', 'readonly'])).code, 0);
      const rotated = await cli(['agent', 'rotate', 'scribe']);
      assert.equal(rotated.code, 0, rotated.stderr);
      const scribe = await connectHttp(server.url, rotated.stdout.trim().split('\n').at(-1)!);
      const denied = scribe.callTool({
        name: 'isphere_send_message',
        arguments: message('not mine to send'),
      });
      await assert.rejects(denied, /not available to this agent/);
      await scribe.close();

      // Reads, and a tool that does not exist.
      assert.equal((await call(demo, 'isphere_search_contacts', { query: 'דוד' })).ok, true);
      await assert.rejects(demo.callTool({ name: 'isphere_no_such_tool', arguments: {} }), /Unknown tool/);

      // A dry run approved at the CLI and executed (the one-statement path), and one executed with an
      // idempotency key (the transaction path).
      const chairAtCli = { env: server.env, name: chair.name, password: 'chair-nm password' };
      const first = await draft('sent at once');
      const approvalId = await approveAsChair(chairAtCli, first);
      const sent = await call(demo, 'isphere_send_message', {
        ...message('sent at once'),
        dry_run: false,
        approval_id: approvalId,
      });
      assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
      const keyed = { ...message('sent with a key'), idempotency_key: 'names-1' };
      const second = await draft('sent with a key', { idempotency_key: 'names-1' });
      const keyedId = await approveAsChair({ approvals: server.services.approvals, user: chair }, second);
      const keyedSent = await call(demo, 'isphere_send_message', {
        ...keyed,
        dry_run: false,
        approval_id: keyedId,
      });
      assert.equal(keyedSent.send_status, 'sent', JSON.stringify(keyedSent.error));

      // A rejection, in decide()'s locking transaction.
      const rejected = await draft('turned down');
      await server.services.approvals.decide({ id: rejected, user: chair, decision: 'reject', note: 'no' });

      // Expiries: swept, met by a chair's decision, met by the execution, met by a new dry run.
      const swept = await draft('left to expire');
      await ageRequest(swept, { expires_at: new Date(0) });
      const late = await draft('decided too late');
      await ageRequest(late, { expires_at: new Date(0) });
      await assert.rejects(
        server.services.approvals.decide({ id: late, user: chair, decision: 'approve' }),
        (err: { reason?: string }) => err.reason === 'expired',
      );
      const stale = await draft('executed too late');
      const staleId = await approveAsChair({ approvals: server.services.approvals, user: chair }, stale);
      await ageRequest(stale, { expires_at: new Date(0) });
      const tooLate = await call(demo, 'isphere_send_message', {
        ...message('executed too late'),
        dry_run: false,
        approval_id: staleId,
      });
      assert.deepEqual([tooLate.error?.code, tooLate.error?.reason], ['APPROVAL_REQUIRED', 'expired']);
      const redrafted = await draft('drafted again');
      await ageRequest(redrafted, { expires_at: new Date(0) });
      assert.notEqual(await draft('drafted again'), redrafted, 'the stale open request gave way');

      // An execution interrupted after write.started, settled by reconciliation (write.failed).
      const interrupted = await draft('interrupted');
      const interruptedId = await approveAsChair(
        { approvals: server.services.approvals, user: chair },
        interrupted,
      );
      await ageRequest(interrupted, {
        status: 'executing',
        execution_started_at: new Date(0),
        execution_source: 'local',
      });
      await server.services.maintain();
      const settled = await server.sql('approval_requests').where({ id: interrupted }).first();
      assert.equal(settled.status, 'failed', interruptedId);

      // A revoked agent is refused, and the refusal names it.
      assert.equal((await cli(['agent', 'revoke', 'scribe'])).code, 0);
      const revokedToken = rotated.stdout.trim().split('\n').at(-1)!;
      await assert.rejects(connectHttp(server.url, revokedToken), /401|Unauthorized/);

      // Every notice queued so far has been tried (the first refused, then delivered).
      const knex = server.sql;
      await waitFor('every notice tried', async () => {
        const open = await knex('notification_outbox').where({ state: 'pending' }).count({ n: '*' }).first();
        return Number(open?.n) === 0 ? true : undefined;
      });

      assert.deepEqual(await misnamedAgentRows(knex), []);
      const named = (await knex('audit_events')
        .whereNotNull('agent_id')
        .select('kind', knex.raw("details->>'agent_name' as name"))) as { kind: string; name: string }[];
      assert.deepEqual([...new Set(named.map((r) => r.kind))].sort(), [...AGENT_KINDS].sort());
      assert.deepEqual([...new Set(named.map((r) => r.name))].sort(), ['demo', 'scribe']);
      const refusal = (await knex('audit_events')
        .where({ kind: 'auth.denied', error_code: 'UNAUTHENTICATED' })
        .whereRaw("details->>'reason' = 'revoked_token'")
        .first()) as { details: Record<string, unknown> | string };
      const details = typeof refusal.details === 'string' ? JSON.parse(refusal.details) : refusal.details;
      assert.equal((details as Record<string, unknown>).agent_name, 'scribe');
    });

    for (const format of ['jsonl', 'csv'] as const) {
      it(`carries each row's agent name into a ${format.toUpperCase()} export that verifies`, async () => {
        const names = await agentNames(server);
        const rows = await exportedRows(server.env, dir, format);
        const about = rows.filter((r) => r.agent_id !== null);
        assert.ok(about.length > 40, `${about.length} rows about agents`);
        for (const r of about) {
          assert.equal(r.details.agent_name, names.get(r.agent_id!), `${r.kind} at seq ${r.seq}`);
        }
        for (const r of rows.filter((x) => x.agent_id === null)) {
          assert.equal(r.details.agent_name, undefined, `${r.kind} at seq ${r.seq} names no agent`);
        }
      });
    }

    it('shows on the audit page the name each row recorded', async () => {
      const web = new WebClient(server.url);
      assert.equal((await web.login(chair.name, 'chair-nm password')).res.status, 303);
      const page = await web.get('/audit?agent=scribe');
      assert.equal(page.res.status, 200);
      const cells = [
        ...page.html.matchAll(/data-label="Agent \/ actor"><span class="clip" title="([^"]*)"/g),
      ];
      assert.ok(cells.length >= 5, page.html);
      assert.deepEqual([...new Set(cells.map((m) => m[1]))], ['scribe']);
    });
  });

  describe(`the agent's name in the rows of a stdio server and its commands on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;

    before(async () => {
      db = await createTestDatabase(kind);
      env = testEnv(db, { COUNTERSIGN_DEMO: 'false' });
    });
    after(async () => db?.drop());

    it('names the agent whose revoked token a stdio server refuses', async () => {
      const added = await runCli(['agent', 'add', 'desktop'], env);
      assert.equal(added.code, 0, added.stderr);
      const token = added.stdout.trim().split('\n').at(-1)!;
      assert.equal((await runCli(['agent', 'revoke', 'desktop'], env)).code, 0);
      const refused = await runCli(['serve', '--stdio', '--no-web'], {
        ...env,
        COUNTERSIGN_AGENT_TOKEN: token,
      });
      assert.equal(refused.code, 1);
      assert.match(refused.stderr, /refused/);

      const rows = await exportedRows(env, db.dataDir, 'jsonl');
      assert.deepEqual(
        rows.filter((r) => r.agent_id !== null).map((r) => [r.kind, r.details.agent_name]),
        [
          ['agent.created', 'desktop'],
          ['agent.revoked', 'desktop'],
          ['auth.denied', 'desktop'],
        ],
      );
    });
  });

  describe(`the audit page's agent column on ${kind}`, () => {
    it('shows the name a row recorded, and for older rows without one the agent as it is now', async () => {
      const { testDb, db } = await openMigratedDatabase(kind);
      try {
        const { agent } = await createAgent(db.knex, { name: 'current' });
        const log = createAuditLog(db.knex);
        const base = {
          kind: 'tool.call',
          agent_id: agent.id,
          tool: 'isphere_search_contacts',
          result: 'ok',
        } as const;
        await log.append({ ...base, details: {} });
        await log.append({ ...base, details: { agent_name: 'as-recorded' } });
        const listed = await queryAudit(db.knex, {}, { limit: 10 });
        assert.deepEqual(
          listed.map((r) => [r.seq, r.agent_name]),
          [
            [2, 'as-recorded'],
            [1, 'current'],
          ],
        );
      } finally {
        await db.close();
        await testDb.drop();
      }
    });
  });
}
