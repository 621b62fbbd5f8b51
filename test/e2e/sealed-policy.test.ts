import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import knexFactory, { type Knex } from 'knex';
import { createUser } from '../../src/accounts/users.ts';
import { runAdminCommand } from '../../src/admin/commands.ts';
import { loadConfig } from '../../src/config.ts';
import { createHostRoots, readHostRoots } from '../../src/core/host-roots.ts';
import type { User } from '../../src/core/identity.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';
import { createLogger } from '../../src/log.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import {
  call,
  connectHttp,
  type SqlServer,
  startSqlServer,
  startTestServer,
  testEnv,
  type TestServer,
} from '../helpers/server.ts';

const rule = (name: string, when: string, then: unknown) => ({ name, when, then });
const ALLOW_ALL = [rule('Everything', 'true', { allow_without_review: { reason: 'a DBA said so' } })];

/** The stored policy row's value, parsed (jsonb comes back parsed on pg, as text on some PGlite paths). */
type StoredValue = { doc: { rules: unknown[] }; version?: string; mac?: string | null };
const valueOf = (row: { value: unknown }) =>
  (typeof row.value === 'string' ? JSON.parse(row.value) : row.value) as StoredValue;

/**
 * What a database administrator with SQL as the table owner, and no shell on the host, can no longer do
 * to the approval policy (docs/policy.md, "The policy is sealed"): each attack is plain SQL on the
 * `settings` row, through a connection of its own on PostgreSQL (PGlite has one connection: the server's).
 */
for (const kind of databaseKinds()) {
  describe(`the sealed approval policy on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chairs: User[];
    let dbaConnection: Knex | undefined;

    before(async () => {
      server = await startTestServer(kind);
      if (server.db.url) dbaConnection = knexFactory({ client: 'pg', connection: server.db.url });
      agent = await connectHttp(server.url, server.demoToken);
      chairs = [];
      for (const name of ['sp-chair-a', 'sp-chair-b']) {
        chairs.push(await createUser(server.sql, { name, roles: ['chair'], password: `${name} pw 1` }));
      }
      await createUser(server.sql, {
        name: 'sp-compliance',
        roles: ['compliance'],
        password: 'sp-compliance pw 1',
      });
    });
    after(async () => {
      await agent?.close();
      await dbaConnection?.destroy();
      await server?.stop();
    });

    const knex = () => server.sql;
    const sql = (text: string, bindings: unknown[] = []) =>
      (dbaConnection ?? knex()).raw(text, bindings as Knex.RawBinding[]);
    const admin = (cmd: Parameters<typeof runAdminCommand>[1]) => runAdminCommand(server.services.admin, cmd);
    const setPolicy = (rules: unknown[]) => server.services.approvals.policy.set({ rules }, 'operator');
    const stored = async () =>
      valueOf(await (dbaConnection ?? knex())('settings').where({ name: 'approval_policy' }).first());
    /** The administrator's rewrite of the stored row, as plain SQL. */
    const rewrite = async (change: (v: StoredValue) => void) => {
      const value = await stored();
      change(value);
      await sql(`update settings set value = ?::jsonb where name = 'approval_policy'`, [
        JSON.stringify(value),
      ]);
    };
    const draft = (content_text: string) =>
      call(agent, 'isphere_send_message', { target_type: 'contact', target_id: 'ct_david', content_text });
    const requestRow = (id: string) => knex()('approval_requests').where({ id }).first();
    const tamperedRows = () => knex()('audit_events').where({ kind: 'policy.tampered' }).orderBy('seq');
    const show = async () => (await admin({ command: 'policy.show' })) as { status: string };
    /** The server's policy read now, rather than within its re-read interval (REREAD_MS). */
    const reread = () => server.services.approvals.policy.fresh();

    it('stores the policy with its seal and applies it', async () => {
      await setPolicy(ALLOW_ALL);
      const value = await stored();
      assert.match(String(value.mac), /^[0-9a-f]{64}$/);
      assert.equal((await show()).status, 'sealed');
      const res = await draft('allowed by the sealed policy');
      assert.equal(res.approval.status, 'approved', 'the operator stored this rule: it applies');
    });

    it('does not let a write through that a policy rewritten by SQL allows without review; audits it once', async () => {
      await setPolicy([]);
      const before = (await tamperedRows()).length;
      await rewrite((v) => {
        v.doc.rules = ALLOW_ALL;
      });
      await reread();
      const res = await draft('let through by the DBA?');
      assert.equal(res.ok, true, JSON.stringify(res.error));
      assert.equal(res.approval.status, 'pending', 'a human must still approve');
      const row = await requestRow(res.approval.approval_request_id);
      assert.deepEqual([row.status, row.required_approvers, row.policy_rule], ['pending', 1, null]);
      await draft('and again');
      const rows = await tamperedRows();
      assert.equal(rows.length, before + 1, 'audited once');
      const last = rows.at(-1);
      assert.deepEqual(
        [last.error_code, detailsOf(last).reason, detailsOf(last).sealed],
        ['TAMPERED', 'policy_tampered', true],
      );
      assert.equal((await show()).status, 'TAMPERED');
    });

    it('still asks the sealed number of approvers when SQL lowers it', async () => {
      await setPolicy([rule('Two for david', 'target.id == "ct_david"', { require: { approvers: 2 } })]);
      await rewrite((v) => {
        v.doc.rules = [rule('Two for david', 'target.id == "ct_david"', { require: { approvers: 1 } })];
      });
      await reread();
      const res = await draft('two, lowered to one by SQL');
      const id = res.approval.approval_request_id;
      assert.equal((await requestRow(id)).required_approvers, 2);
      const one = await server.services.approvals.decide({ id, user: chairs[0]!, decision: 'approve' });
      assert.equal(one.status, 'pending', 'one approval is not enough');
    });

    it('refuses a policy whose seal was nulled, or copied from another policy', async () => {
      await setPolicy([]);
      const emptyMac = (await stored()).mac;
      await setPolicy(ALLOW_ALL);
      await rewrite((v) => {
        v.mac = null;
      });
      await reread();
      assert.equal((await draft('seal nulled')).approval.status, 'pending');
      assert.equal((await show()).status, 'TAMPERED');

      await setPolicy(ALLOW_ALL);
      await rewrite((v) => {
        v.mac = emptyMac;
      });
      await reread();
      assert.equal((await draft('seal copied')).approval.status, 'pending');
      assert.equal((await show()).status, 'TAMPERED');
    });

    it('refuses a sealed policy put back as it was before a later change, and a stored policy deleted', async () => {
      await setPolicy(ALLOW_ALL);
      const allowing = await stored();
      await setPolicy([rule('Two for david', 'target.id == "ct_david"', { require: { approvers: 2 } })]);
      await sql(`update settings set value = ?::jsonb where name = 'approval_policy'`, [
        JSON.stringify(allowing),
      ]);
      await reread();
      const replayed = await draft('let through by an earlier policy?');
      assert.equal(replayed.approval.status, 'pending', 'the earlier policy, seal and all, is not applied');
      assert.equal((await requestRow(replayed.approval.approval_request_id)).required_approvers, 2);
      assert.equal((await show()).status, 'TAMPERED');

      await setPolicy(ALLOW_ALL);
      await sql(`delete from settings where name = 'approval_policy'`);
      await reread();
      assert.equal((await show()).status, 'TAMPERED', "not the config file's policy: the log holds a change");
      const deleted = (await tamperedRows()).at(-1);
      assert.equal(detailsOf(deleted).deleted, true);
    });

    it('is restored by `policy set` on the host, audited', async () => {
      await setPolicy([]);
      await rewrite((v) => {
        v.doc.rules = ALLOW_ALL;
      });
      await reread();
      assert.equal((await show()).status, 'TAMPERED');
      const health = (await (await fetch(new URL('/healthz', server.url))).json()) as {
        status: string;
        approval_policy: { state: string };
      };
      assert.deepEqual([health.status, health.approval_policy.state], ['degraded', 'tampered']);
      const web = new WebClient(server.url);
      assert.equal((await web.login('sp-compliance', 'sp-compliance pw 1')).res.status, 303);
      assert.match((await web.get('/admin/policy')).html, /TAMPERED/);
      const result = (await admin({
        command: 'policy.set',
        policy: { rules: ALLOW_ALL },
        actor: 'operator',
      })) as { changed: boolean };
      assert.equal(result.changed, true);
      assert.equal((await show()).status, 'sealed');
      await reread();
      assert.equal((await draft('restored')).approval.status, 'approved');
      const changed = await knex()('audit_events')
        .where({ kind: 'policy.changed' })
        .orderBy('seq', 'desc')
        .first();
      assert.deepEqual([changed.actor, detailsOf(changed).was_tampered], ['operator', true]);
      assert.doesNotMatch((await web.get('/admin/policy')).html, /TAMPERED/);
    });
  });

  describe(`a policy stored before the seal on ${kind}`, () => {
    let testDb: TestDatabase;
    let server: SqlServer | undefined;
    let rootsFile: string;

    before(async () => {
      testDb = await createTestDatabase(kind);
      const db = await openDatabase({
        url: testDb.url,
        pgliteDir: path.join(testDb.dataDir, 'pglite'),
        command: 'test',
      });
      await migrateLatest(db.knex);
      rootsFile = path.join(testDb.dataDir, 'host-roots.json');
      // The roots file as the version before the seal made it (no policy_sealed), and its policy row.
      createHostRoots(rootsFile, () => `countersign:${randomUUID()}`, { agent_token_hashes: [] });
      await db.knex('settings').insert({
        name: 'approval_policy',
        value: JSON.stringify({
          doc: { timezone: 'UTC', rules: ALLOW_ALL },
          version: 'from before',
          changed_by: 'operator',
          changed_at: new Date().toISOString(),
        }),
      });
      await db.close();
    });
    after(async () => {
      await server?.close();
      await testDb?.drop();
    });

    const start = async () => {
      const config = loadConfig(testEnv(testDb), testDb.dataDir);
      server = await startSqlServer(config, createLogger('silent'));
      return server;
    };
    const showStatus = async (s: SqlServer) =>
      ((await runAdminCommand(s.services.admin, { command: 'policy.show' })) as { status: string }).status;

    it('seals it once at the first start, says so in the host roots file, and keeps applying it', async () => {
      const s = await start();
      assert.equal(readHostRoots(rootsFile)!.policySealed, true);
      const file = JSON.parse(fs.readFileSync(rootsFile, 'utf8')) as { policy_sealed?: { at: string } };
      assert.ok(file.policy_sealed?.at);
      const row = valueOf(await s.sql('settings').where({ name: 'approval_policy' }).first());
      assert.match(String(row.mac), /^[0-9a-f]{64}$/);
      assert.equal(await showStatus(s), 'sealed');
    });

    it('never seals again: a seal removed by SQL after the upgrade stays TAMPERED across a restart', async () => {
      await server!.sql.raw(`update settings set value = value - 'mac' where name = 'approval_policy'`);
      await server!.close();
      server = undefined;
      const s = await start();
      const row = valueOf(await s.sql('settings').where({ name: 'approval_policy' }).first());
      assert.equal(row.mac, undefined, 'not sealed again by the start');
      assert.equal(await showStatus(s), 'TAMPERED');
    });

    it('keeps the approvers the last sealed policy asked for after a restart while the row is TAMPERED', async () => {
      const s = server!;
      const three = [rule('Three for david', 'target.id == "ct_david"', { require: { approvers: 3 } })];
      await runAdminCommand(s.services.admin, {
        command: 'policy.set',
        policy: { rules: three },
        actor: 'op',
      });
      const value = valueOf(await s.sql('settings').where({ name: 'approval_policy' }).first());
      await s
        .sql('settings')
        .where({ name: 'approval_policy' })
        .update({ value: JSON.stringify({ ...value, doc: { ...value.doc, rules: [] } }) });
      await s.close();
      server = undefined;
      const restarted = await start();
      const held = await restarted.services.approvals.policy.fresh();
      assert.equal(held.tampered, true);
      assert.deepEqual(held.defaultFor('isphere_send_message').requirement, {
        kind: 'require',
        approvers: 3,
      });
    });
  });
}
