import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
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
import { call, connectHttp, testEnv } from '../helpers/server.ts';
import { lazyHostRoots } from '../../src/db/host-roots.ts';

// Several processes can share only PostgreSQL; the embedded database allows one process.
describeOnPostgres('50 concurrent executions of one approval across 3 server processes on PostgreSQL', () => {
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

  it('writes exactly one message and answers 49 structured refusals', async () => {
    const args = {
      target_type: 'group',
      target_id: 'gr_board',
      content_text: 'Exactly once, across processes.',
    };
    const draft = await call(clients[0]!, 'isphere_send_message', args);
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
    const approvalId = await approveAsChair({ approvals, user: chair }, draft);

    const results = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        call(clients[i % 3]!, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        }),
      ),
    );
    const sent = results.filter((r) => r.ok);
    const refused = results.filter((r) => !r.ok);
    assert.equal(sent.length, 1);
    assert.equal(sent[0]!.send_status, 'sent');
    assert.equal(refused.length, 49);
    for (const r of refused) {
      assert.equal(r.error.code, 'APPROVAL_REQUIRED');
      assert.equal(r.error.reason, 'consumed');
      assert.ok(r.audit.audit_seq > 0);
    }
    const messages = await direct.knex('messages').where({ content_text: args.content_text });
    assert.equal(messages.length, 1);
    const started = await direct
      .knex('audit_events')
      .where({ kind: 'write.started', approval_id: approvalId });
    assert.equal(started.length, 1);
    const report = await verifyDatabaseChain(direct.knex);
    assert.equal(report.first_bad, undefined);
  });
});
