import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import { createApprovals } from '../../src/approval/approvals.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { loadConfig } from '../../src/config.ts';
import { openDatabase, type Database } from '../../src/db/knex.ts';
import { createUser } from '../../src/accounts/users.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { lazyHostRoots } from '../../src/db/host-roots.ts';
import {
  call,
  connectHttp,
  startTestServer,
  testEnv,
  type Envelope,
  type TestServer,
} from '../helpers/server.ts';

const ROUNDS = 30;
const RACERS = 5;

/** A call's answer: its envelope, or the protocol error it was answered with. */
async function answer(client: Client, name: string, args: Record<string, unknown>): Promise<Answer> {
  try {
    return { envelope: await call(client, name, args) };
  } catch (err) {
    if (err instanceof ProtocolError) return { protocol: err };
    throw err;
  }
}

type Answer = { envelope: Envelope } | { protocol: ProtocolError };

const describe = (a: Answer) =>
  'envelope' in a
    ? JSON.stringify(a.envelope.ok ? a.envelope.send_status : a.envelope.error)
    : `${a.protocol.code} ${a.protocol.message} ${JSON.stringify(a.protocol.data)}`;

// Several processes share only PostgreSQL; the embedded database allows one process.
describeOnPostgres('executions racing across 3 server processes, with reads beside them', () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  let servers: Awaited<ReturnType<typeof spawnServer>>[] = [];
  let clients: Client[] = [];
  let direct: Database;

  before(async () => {
    db = await createTestDatabase('postgres');
    env = testEnv(db, { COUNTERSIGN_DEMO: 'false' });
    assert.equal((await runCli(['demo'], env)).code, 0);
    const added = await runCli(['agent', 'add', 'racer'], env);
    const token = added.stdout.trim().split('\n').at(-1)!;
    servers = await Promise.all([spawnServer(env), spawnServer(env), spawnServer(env)]);
    clients = await Promise.all(servers.map((s) => connectHttp(s.url, token)));
    direct = await openDatabase({ url: db.url, pgliteDir: '', command: 'test' });
  });
  after(async () => {
    await Promise.allSettled(clients.map((c) => c.close()));
    await Promise.allSettled(servers.map((s) => stopChild(s.child)));
    await direct?.close();
    await db?.drop();
  });

  it('never answers a deadlock: one write per approval, every answer structured and audited', async () => {
    const config = loadConfig(env, db.dataDir);
    const approvals = createApprovals({
      knex: direct.knex,
      audit: createAuditLog(direct.knex),
      config,
      // The replicas' host roots file: a decision made here is checked by them.
      roots: lazyHostRoots(direct.knex, config.secrets.host_roots_path),
      reviewUrl: (id) => id,
    });
    // After the roots are known for this database: a user's record is sealed under them.
    const chair = await createUser(direct.knex, {
      name: 'chair',
      roles: ['chair'],
      password: 'race-password',
    });
    for (let round = 0; round < ROUNDS; round++) {
      const args = { target_type: 'group', target_id: 'gr_board', content_text: `lock order ${round}` };
      const draft = await call(clients[round % 3]!, 'isphere_send_message', args);
      const approvalId = await approveAsChair({ approvals, user: chair }, draft);
      const requestId = draft.approval.approval_request_id as string;

      const [writes, reads] = await Promise.all([
        Promise.all(
          Array.from({ length: RACERS }, (_, i) =>
            answer(clients[(round + i) % 3]!, 'isphere_send_message', {
              ...args,
              dry_run: false,
              approval_id: approvalId,
            }),
          ),
        ),
        Promise.all(clients.map((c) => answer(c, 'isphere_search_contacts', { query: 'david' }))),
      ]);
      for (const a of [...writes, ...reads]) {
        assert.ok('envelope' in a, `round ${round}: ${describe(a)}`);
        assert.ok(a.envelope.audit.audit_seq > 0);
      }
      const envelopes = writes.map((a) => (a as { envelope: Envelope }).envelope);
      const sent = envelopes.filter((e) => e.ok);
      assert.equal(sent.length, 1, `round ${round}: ${writes.map(describe).join('; ')}`);
      assert.equal(sent[0]!.send_status, 'sent');
      for (const e of envelopes.filter((x) => !x.ok)) {
        assert.equal(e.error.code, 'APPROVAL_REQUIRED');
        assert.equal(e.error.reason, 'consumed');
      }
      for (const r of reads) assert.equal((r as { envelope: Envelope }).envelope.ok, true);

      assert.equal((await direct.knex('messages').where({ write_key: approvalId })).length, 1);
      const request = (await direct.knex('approval_requests').where({ id: requestId }).first()) as {
        status: string;
      };
      assert.equal(request.status, 'succeeded');
      const started = await direct
        .knex('audit_events')
        .where({ kind: 'write.started', approval_request_id: requestId });
      assert.equal(started.length, 1, `round ${round}: audited once`);
    }
    assert.equal((await verifyDatabaseChain(direct.knex)).first_bad, undefined);
  });
});

describeOnPostgres('database errors on the call path', () => {
  let server: TestServer;
  let deadlocked: Client;
  let broken: Client;

  before(async () => {
    server = await startTestServer('postgres');
    deadlocked = await connectHttp(server.url, await server.addAgent('deadlocked'));
    broken = await connectHttp(server.url, await server.addAgent('broken'));
    // A stand-in for the database aborting statements: a trigger on the audit table that fails the
    // successful call rows of one tool, by the agent that made the call.
    await server.sql.raw(`
      create sequence test_fault_once;
      create function test_fault() returns trigger language plpgsql as $$
      begin
        if new.kind = 'tool.call' and new.result = 'ok' and new.tool = 'isphere_search_contacts' then
          if new.details->>'agent_name' = 'deadlocked' and nextval('test_fault_once') = 1 then
            raise exception 'deadlock detected (a stand-in)' using errcode = '40P01';
          end if;
          if new.details->>'agent_name' = 'broken' then
            raise exception 'secret database text' using errcode = 'XX000';
          end if;
        end if;
        return new;
      end $$;
      create trigger test_fault before insert on audit_events for each row execute function test_fault();`);
  });
  after(async () => {
    await server?.sql.raw('drop trigger if exists test_fault on audit_events');
    await deadlocked?.close();
    await broken?.close();
    await server?.stop();
  });

  it('runs an append that PostgreSQL aborted as a deadlock again, and audits the call once', async () => {
    const res = await answer(deadlocked, 'isphere_search_contacts', { query: 'david' });
    assert.ok('envelope' in res, describe(res));
    assert.equal(res.envelope.ok, true);
    const rows = await server
      .sql('audit_events')
      .where({ kind: 'tool.call', tool: 'isphere_search_contacts' })
      .whereRaw("details->>'agent_name' = 'deadlocked'");
    assert.equal(rows.length, 1);
  });

  it('answers any other database error -32603 INTERNAL with a trace id and an audit row, never its text', async () => {
    const res = await answer(broken, 'isphere_search_contacts', { query: 'david' });
    assert.ok('protocol' in res, describe(res));
    assert.equal(res.protocol.code, -32603);
    const data = res.protocol.data as { code: string; trace_id: string };
    assert.equal(data.code, 'INTERNAL');
    assert.match(data.trace_id, /^[0-9a-f]{32}$/);
    assert.doesNotMatch(JSON.stringify({ m: res.protocol.message, data }), /secret database text/);
    const row = await server.sql('audit_events').where({ trace_id: data.trace_id }).first();
    assert.equal(row?.error_code, 'INTERNAL_ERROR');
  });
});
