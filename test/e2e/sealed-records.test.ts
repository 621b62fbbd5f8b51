import assert from 'node:assert/strict';
import { randomBytes, randomUUID } from 'node:crypto';
import canonicalize from 'canonicalize';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import knexFactory, { type Knex } from 'knex';
import { createAgent } from '../../src/accounts/agents.ts';
import { userSealedText } from '../../src/accounts/authority.ts';
import { createUser, hashPassword } from '../../src/accounts/users.ts';
import { runAdminCommand } from '../../src/admin/commands.ts';
import { loadConfig } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import { createHostRoots, readHostRoots } from '../../src/core/host-roots.ts';
import type { User } from '../../src/core/identity.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';
import { createLogger } from '../../src/log.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { createTestDatabase, databaseKinds, type DbKind, type TestDatabase } from '../helpers/db.ts';
import {
  call,
  connectHttp,
  type SqlServer,
  startSqlServer,
  startTestServer,
  testEnv,
  type TestServer,
} from '../helpers/server.ts';

const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
};

/** An initialize with `token`: the HTTP status and the problem's code and reason. */
async function tryToken(url: string, token: string) {
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${token}`,
    },
    body: JSON.stringify(INIT),
  });
  const text = await res.text();
  const problem = res.status >= 400 ? (JSON.parse(text) as { code: string; reason: string }) : undefined;
  return { status: res.status, code: problem?.code, reason: problem?.reason };
}

/**
 * What a database administrator with SQL as the table owner, and no shell on the host, can no longer
 * do to the users' and agents' records (docs/identity.md, "Sealed records"): each attack is plain SQL,
 * through a connection of its own on PostgreSQL (PGlite has one connection: the server's).
 */
/** A database as an earlier version left it: migrated, with its host roots file, and no server yet. */
async function earlierInstall(kind: DbKind) {
  const testDb = await createTestDatabase(kind);
  const db = await openDatabase({
    url: testDb.url,
    pgliteDir: path.join(testDb.dataDir, 'pglite'),
    command: 'test',
  });
  await migrateLatest(db.knex);
  const rootsFile = path.join(testDb.dataDir, 'host-roots.json');
  const { roots } = createHostRoots(rootsFile, () => `countersign:${randomUUID()}`, {
    agent_token_hashes: [],
  });
  return { testDb, db, rootsFile, roots };
}

for (const kind of databaseKinds()) {
  describe(`sealed user and agent records on ${kind}`, () => {
    let server: TestServer;
    let dbaConnection: Knex | undefined;

    before(async () => {
      server = await startTestServer(kind);
      if (server.db.url) dbaConnection = knexFactory({ client: 'pg', connection: server.db.url });
    });
    after(async () => {
      await dbaConnection?.destroy();
      await server?.stop();
    });

    const knex = () => server.sql;
    /** The administrator's SQL. */
    const sql = (text: string, bindings: unknown[] = []) =>
      (dbaConnection ?? knex()).raw(text, bindings as Knex.RawBinding[]);
    const login = async (name: string, password: string) =>
      (await new WebClient(server.url).login(name, password)).res.status;
    const user = (name: string, roles: User['roles'] = ['chair']) =>
      createUser(knex(), { name, roles, password: `${name} password` });
    const tamperedRows = async (kind: 'user' | 'agent', name: string) =>
      (
        await knex()('audit_events')
          .where({ kind: `${kind}.record_tampered` })
          .orderBy('seq')
      )
        .map((r) => ({ ...r, details: detailsOf(r) }))
        .filter((r) => r.details[kind] === name);
    const admin = (cmd: Parameters<typeof runAdminCommand>[1]) => runAdminCommand(server.services.admin, cmd);

    it('refuses a sign-in as a chair whose password hash was set by SQL, and records it', async () => {
      await user('sr-pw');
      assert.equal(await login('sr-pw', 'sr-pw password'), 303, 'the chair signs in before');
      await sql('update users set password_hash = ? where name = ?', [
        await hashPassword('attacker pw 1'),
        'sr-pw',
      ]);
      assert.equal(await login('sr-pw', 'attacker pw 1'), 401, "the attacker's password opens nothing");
      const [row] = await tamperedRows('user', 'sr-pw');
      assert.ok(row, 'user.record_tampered recorded');
      assert.deepEqual([row.error_code, row.details.reason], ['TAMPERED', 'user_record_tampered']);
    });

    it('refuses a user given the chair role by SQL: their session ends, and no sign-in', async () => {
      await user('sr-mallory', ['compliance']);
      const web = new WebClient(server.url);
      assert.equal((await web.login('sr-mallory', 'sr-mallory password')).res.status, 303);
      assert.equal((await web.get('/audit')).res.status, 200, 'a compliance session works');
      await sql(`update users set roles = '["chair"]' where name = ?`, ['sr-mallory']);
      assert.equal((await web.get('/approvals')).res.status, 303, 'the session is refused (to sign-in)');
      assert.equal(await login('sr-mallory', 'sr-mallory password'), 401);
      const rows = await tamperedRows('user', 'sr-mallory');
      assert.deepEqual(
        rows.map((r) => r.details.where),
        ['session', 'sign_in_web'],
      );
    });

    it('refuses a session whose row was pointed at a chair by SQL', async () => {
      const chair = await user('sr-pointed-chair');
      await user('sr-pointer', ['compliance']);
      const web = new WebClient(server.url);
      assert.equal((await web.login('sr-pointer', 'sr-pointer password')).res.status, 303);
      assert.equal((await web.get('/approvals')).res.status, 200, 'her own session works');
      const mine = await knex()('users').where({ name: 'sr-pointer' }).first('id');
      await sql('update web_sessions set user_id = ? where user_id = ?', [chair.id, mine.id]);
      assert.equal((await web.get('/approvals')).res.status, 303, 'not the chair: back to sign-in');
      const [row] = await tamperedRows('user', 'sr-pointed-chair');
      assert.equal(row?.details.where, 'session_user_changed');
    });

    it('refuses a disabled user re-enabled by SQL', async () => {
      await user('sr-gone');
      await admin({ command: 'user.disable', name: 'sr-gone', actor: 'test' });
      assert.equal(await login('sr-gone', 'sr-gone password'), 401);
      await sql('update users set disabled_at = null where name = ?', ['sr-gone']);
      assert.equal(await login('sr-gone', 'sr-gone password'), 401, 'still refused');
      assert.equal((await tamperedRows('user', 'sr-gone')).length, 1);
    });

    it('refuses a single sign-on as a chair whose identity at the provider was remapped by SQL', async () => {
      const issuer = 'https://idp.example.test';
      const identity = (subject: string, name: string) => ({
        issuer,
        subject,
        name,
        roles: ['chair' as const],
        email: undefined,
        claimed_email: undefined,
      });
      const first = await server.services.signIn.withOidc(identity('sub-chair', 'sr-sso-chair'));
      assert.ok('user' in first, JSON.stringify(first));
      await sql('update users set oidc_subject = ? where name = ?', ['sub-attacker', 'sr-sso-chair']);
      const attacker = await server.services.signIn.withOidc(identity('sub-attacker', 'whoever'));
      assert.deepEqual(attacker, { failure: 'tampered', name: 'sr-sso-chair' });
      const [row] = await tamperedRows('user', 'sr-sso-chair');
      assert.deepEqual([row?.details.where, row?.details.subject], ['sign_in_oidc', 'sub-attacker']);
    });

    it('does not count an approval whose approver was given roles or teams by SQL: execution refuses it', async () => {
      const chair = await user('sr-approver');
      const agent = await connectHttp(server.url, server.demoToken);
      try {
        const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'sealed approver' };
        const draft = await call(agent, 'isphere_send_message', args);
        const approvalId = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
        await sql(`update users set teams = '["finance"]' where name = ?`, ['sr-approver']);
        const res = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(
          [res.ok, res.error?.code, res.error?.reason],
          [false, 'TAMPERED', 'approver_record_tampered'],
        );
        const row = await knex()('audit_events').where({ seq: res.audit.audit_seq }).first();
        assert.deepEqual([row.error_code, detailsOf(row).reason], ['TAMPERED', 'approver_record_tampered']);
        const sent = await knex()('messages').where({ write_key: approvalId }).count({ n: '*' }).first();
        assert.equal(Number(sent?.n), 0, 'nothing delivered');
      } finally {
        await agent.close();
      }
    });

    it('refuses an agent whose profile, limit, owner or revocation was changed by SQL', async () => {
      const owner = await user('sr-owner');
      const changes: [string, string, unknown[]][] = [
        ['sr-profile', `update agents set profile = 'all' where name = ?`, []],
        ['sr-limit', 'update agents set rate_limit_per_min = 100000 where name = ?', []],
        ['sr-owned', 'update agents set owner_id = ? where name = ?', [owner.id]],
        ['sr-unrevoked', 'update agents set revoked_at = null where name = ?', []],
      ];
      for (const [name, text, bindings] of changes) {
        const { token } = await createAgent(knex(), {
          name,
          profile: 'readonly',
          rate_limit_per_min: 5,
        });
        if (name === 'sr-unrevoked') await admin({ command: 'agent.revoke', name, actor: 'test' });
        await sql(text, [...bindings, name]);
        assert.deepEqual(
          await tryToken(server.url, token),
          { status: 401, code: 'NOT_LOGGED_IN', reason: 'agent_record_tampered' },
          name,
        );
        const denied = await knex()('audit_events')
          .where({ kind: 'auth.denied' })
          .orderBy('seq', 'desc')
          .first();
        assert.deepEqual([denied.error_code, detailsOf(denied).agent_name], ['TAMPERED', name]);
      }
    });

    /** The record as it stands now, every column: what an administrator keeps to put back later. */
    const snapshot = async (table: 'users' | 'agents', name: string) =>
      (await knex()(table).where({ name }).first()) as Record<string, unknown>;
    /** The administrator's SQL: every column of the record written back as `saved` had it, seal and all. */
    const putBack = async (table: 'users' | 'agents', saved: Record<string, unknown>) => {
      const { id, ...columns } = saved;
      const values = Object.fromEntries(
        Object.entries(columns).map(([k, v]) => [
          k,
          v !== null && typeof v === 'object' && !(v instanceof Date) ? JSON.stringify(v) : v,
        ]),
      );
      await (dbaConnection ?? knex())(table)
        .where({ id: id as string })
        .update(values as Record<string, Knex.Value>);
    };

    it('keeps a revoked agent revoked when its row is put back whole, seal included, as it was before', async () => {
      const made = await createAgent(knex(), { name: 'sr-rolled-back', profile: 'readonly' });
      const saved = await snapshot('agents', 'sr-rolled-back');
      await admin({ command: 'agent.revoke', name: 'sr-rolled-back', actor: 'test' });
      await putBack('agents', saved);
      const tried = await tryToken(server.url, made.token);
      assert.deepEqual(
        [tried.status, tried.reason],
        [401, 'agent_record_tampered'],
        'the log holds a change after the one its seal binds',
      );
    });

    it('refuses a user put back whole as before a disable, a demotion or a password reset', async () => {
      await user('sr-replay-off');
      const beforeDisable = await snapshot('users', 'sr-replay-off');
      await admin({ command: 'user.disable', name: 'sr-replay-off', actor: 'test' });
      await putBack('users', beforeDisable);
      assert.equal(await login('sr-replay-off', 'sr-replay-off password'), 401, 'disabled stays disabled');

      await user('sr-replay-chair');
      const asChair = await snapshot('users', 'sr-replay-chair');
      await admin({ command: 'user.set', name: 'sr-replay-chair', roles: ['compliance'], actor: 'test' });
      assert.equal(await login('sr-replay-chair', 'sr-replay-chair password'), 303, 'signs in as compliance');
      await putBack('users', asChair);
      assert.equal(await login('sr-replay-chair', 'sr-replay-chair password'), 401, 'not a chair again');

      await user('sr-replay-pw');
      const oldPassword = await snapshot('users', 'sr-replay-pw');
      const reset = { command: 'user.reset_password', name: 'sr-replay-pw', actor: 'test' } as const;
      await admin({ ...reset, password: 'a new password 1' });
      await putBack('users', oldPassword);
      assert.equal(
        await login('sr-replay-pw', 'sr-replay-pw password'),
        401,
        'the old password opens nothing',
      );

      for (const name of ['sr-replay-off', 'sr-replay-chair', 'sr-replay-pw'])
        assert.ok((await tamperedRows('user', name)).length >= 1, `${name}: user.record_tampered recorded`);
    });

    it('refuses an agent put back whole as before its token was rotated or its profile narrowed', async () => {
      const made = await createAgent(knex(), { name: 'sr-replay-token', profile: 'all' });
      const oldToken = await snapshot('agents', 'sr-replay-token');
      await admin({ command: 'agent.rotate', name: 'sr-replay-token', actor: 'test' });
      assert.equal((await tryToken(server.url, made.token)).status, 401, 'the old token ends at rotation');
      await putBack('agents', oldToken);
      assert.deepEqual(
        (await tryToken(server.url, made.token)).reason,
        'agent_record_tampered',
        'the leaked token stays refused',
      );

      const wide = await createAgent(knex(), { name: 'sr-replay-profile', profile: 'all' });
      assert.equal((await tryToken(server.url, wide.token)).status, 200, 'the wide agent works');
      const asWide = await snapshot('agents', 'sr-replay-profile');
      // The command drops the agent from the cache as it commits: its next call reads the record.
      await admin({ command: 'agent.set', name: 'sr-replay-profile', profile: 'readonly', actor: 'test' });
      await putBack('agents', asWide);
      assert.equal((await tryToken(server.url, wide.token)).reason, 'agent_record_tampered');
    });

    it('binds each seal to the seq of its change: the record says which row sealed it', async () => {
      await user('sr-seq');
      await admin({ command: 'user.set_teams', name: 'sr-seq', teams: ['ops'], actor: 'test' });
      const row = await snapshot('users', 'sr-seq');
      const changed = await knex()('audit_events')
        .where({ kind: 'user.teams_changed' })
        .orderBy('seq', 'desc')
        .first();
      assert.equal(Number(row.sealed_seq), Number(changed.seq));
      assert.equal(await login('sr-seq', 'sr-seq password'), 303, 'the change itself is no replay');
    });

    it("refuses a token whose hash was copied onto another agent's row", async () => {
      const weak = await createAgent(knex(), { name: 'sr-weak', profile: 'readonly' });
      await createAgent(knex(), { name: 'sr-strong', profile: 'all' });
      const { token_hash: weakHash } = (await knex()('agents').where({ name: 'sr-weak' }).first()) as {
        token_hash: string;
      };
      // The weak agent's token hash moves onto the strong agent's row: its token now finds that row.
      await sql(`update agents set token_hash = 'moved-' || id where name = 'sr-weak'`);
      await sql(`update agents set token_hash = ? where name = 'sr-strong'`, [weakHash]);
      const tried = await tryToken(server.url, weak.token);
      assert.deepEqual([tried.status, tried.reason], [401, 'agent_record_tampered']);
    });

    it("refuses a record whose MAC was nulled, copied from another row or swapped with another's", async () => {
      for (const name of ['sr-null', 'sr-copy-a', 'sr-copy-b', 'sr-swap-a', 'sr-swap-b']) await user(name);
      await sql(`update users set authority_mac = null where name = 'sr-null'`);
      await sql(
        `update users set authority_mac = (select authority_mac from users where name = 'sr-copy-a')
         where name = 'sr-copy-b'`,
      );
      await sql(
        `update users u set authority_mac = o.authority_mac from users o
         where (u.name, o.name) in (('sr-swap-a', 'sr-swap-b'), ('sr-swap-b', 'sr-swap-a'))`,
      );
      for (const [name, status] of [
        ['sr-null', 401],
        ['sr-copy-a', 303],
        ['sr-copy-b', 401],
        ['sr-swap-a', 401],
        ['sr-swap-b', 401],
      ] as const)
        assert.equal(await login(name, `${name} password`), status, name);
    });

    it("takes roles as a set: their order or the JSON's spacing is no tampering", async () => {
      await createUser(knex(), {
        name: 'sr-order',
        roles: ['chair', 'compliance'],
        password: 'sr-order password',
      });
      await sql(`update users set roles = '[ "compliance",   "chair" ]' where name = 'sr-order'`);
      assert.equal(await login('sr-order', 'sr-order password'), 303);
    });

    it("never launders a tampered record: an admin's change to another field is refused and recorded", async () => {
      await user('sr-launder', ['compliance']);
      await sql(`update users set roles = '["chair"]' where name = 'sr-launder'`);
      const mac = async () =>
        ((await knex()('users').where({ name: 'sr-launder' }).first()) as { authority_mac: string })
          .authority_mac;
      const before = await mac();
      for (const cmd of [
        { command: 'user.set_email', name: 'sr-launder', email: 'l@example.com', actor: 'admin' },
        { command: 'user.set_teams', name: 'sr-launder', teams: ['ops'], actor: 'admin' },
        { command: 'user.reset_password', name: 'sr-launder', password: 'another password', actor: 'admin' },
      ] as const) {
        await assert.rejects(admin(cmd), (err: unknown) =>
          isAppError(err, 'TAMPERED', 'user_record_tampered'),
        );
      }
      assert.equal(await mac(), before, 'the seal is not made again over the change');
      assert.equal((await tamperedRows('user', 'sr-launder')).length, 3);
      assert.equal(await login('sr-launder', 'sr-launder password'), 401);

      await createAgent(knex(), { name: 'sr-agent-launder', profile: 'readonly' });
      await sql(`update agents set profile = 'all' where name = 'sr-agent-launder'`);
      for (const cmd of [
        { command: 'agent.set', name: 'sr-agent-launder', rate_limit_per_min: 10, actor: 'admin' },
        { command: 'agent.rotate', name: 'sr-agent-launder', actor: 'admin' },
        { command: 'agent.revoke', name: 'sr-agent-launder', actor: 'admin' },
      ] as const) {
        await assert.rejects(admin(cmd), (err: unknown) =>
          isAppError(err, 'TAMPERED', 'agent_record_tampered'),
        );
      }
      assert.equal((await tamperedRows('agent', 'sr-agent-launder')).length, 3);
    });

    it("reseals a record as it stands on the operator's command, audited with the fields sealed", async () => {
      await user('sr-reseal', ['compliance']);
      await sql(`update users set teams = '["ops"]' where name = 'sr-reseal'`);
      assert.equal(await login('sr-reseal', 'sr-reseal password'), 401);
      const listed = async () =>
        (
          (await admin({ command: 'user.list' })) as { users: { name: string; sealed?: boolean }[] }
        ).users.find((u) => u.name === 'sr-reseal')?.sealed;
      assert.equal(await listed(), false, 'user list says which records fail');
      const result = (await admin({ command: 'user.reseal', name: 'sr-reseal', actor: 'operator' })) as {
        was_sealed: boolean;
        sealed: Record<string, unknown>;
      };
      assert.equal(result.was_sealed, false);
      assert.deepEqual(
        [result.sealed.teams, result.sealed.roles, result.sealed.password],
        [['ops'], ['compliance'], true],
      );
      assert.equal(await login('sr-reseal', 'sr-reseal password'), 303);
      assert.equal(await listed(), true);
      const row = await knex()('audit_events')
        .where({ kind: 'user.resealed' })
        .orderBy('seq', 'desc')
        .first();
      assert.equal(row.actor, 'operator');
      assert.deepEqual(detailsOf(row).sealed, result.sealed);
      assert.equal(JSON.stringify(detailsOf(row)).includes('scrypt$'), false, 'no password hash in the log');

      const made = await createAgent(knex(), { name: 'sr-agent-reseal', profile: 'readonly' });
      await sql(`update agents set rate_limit_per_min = 7 where name = 'sr-agent-reseal'`);
      assert.equal((await tryToken(server.url, made.token)).status, 401);
      await admin({ command: 'agent.reseal', name: 'sr-agent-reseal', actor: 'operator' });
      assert.equal((await tryToken(server.url, made.token)).status, 200);
      const agentRow = await knex()('audit_events')
        .where({ kind: 'agent.resealed' })
        .orderBy('seq', 'desc')
        .first();
      assert.equal((detailsOf(agentRow).sealed as { rate_limit_per_min: number }).rate_limit_per_min, 7);
    });
  });

  describe(`records from before the seals on ${kind}`, () => {
    let testDb: TestDatabase;
    let server: SqlServer | undefined;
    let rootsFile: string;
    const token = `cs_${randomBytes(32).toString('base64url')}`;
    const userId = randomUUID();

    before(async () => {
      // The roots file as the version before the seals made it (no records_sealed), and its records.
      const { db, roots, ...made } = await earlierInstall(kind);
      ({ testDb, rootsFile } = made);
      await db.knex('users').insert({
        id: userId,
        name: 'old-chair',
        roles: JSON.stringify(['chair']),
        password_hash: await hashPassword('old chair password'),
      });
      await db.knex('agents').insert({
        id: randomUUID(),
        name: 'old-agent',
        profile: 'all',
        token_hash: roots.mac('agent-token', token),
        token_tagged: false,
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

    it('seals them once at the first start, and says so in the host roots file', async () => {
      const s = await start();
      assert.equal(readHostRoots(rootsFile)!.recordsSealed, true);
      const file = JSON.parse(fs.readFileSync(rootsFile, 'utf8')) as { records_sealed?: { at: string } };
      assert.ok(file.records_sealed?.at);
      assert.equal((await new WebClient(s.url).login('old-chair', 'old chair password')).res.status, 303);
      assert.equal((await tryToken(s.url, token)).status, 200);
    });

    it('never seals again: a seal nulled by SQL after the upgrade stays refused across a restart', async () => {
      await server!.sql.raw(`update users set authority_mac = null where id = ?`, [userId]);
      await server!.close();
      server = undefined;
      const s = await start();
      const row = await s.sql('users').where({ id: userId }).first();
      assert.equal(row.authority_mac, null, 'not sealed again by the start');
      assert.equal((await new WebClient(s.url).login('old-chair', 'old chair password')).res.status, 401);
    });
  });

  describe(`records sealed before seals bound their change on ${kind}`, () => {
    let testDb: TestDatabase;
    let server: SqlServer | undefined;
    let rootsFile: string;
    let v1Row: Record<string, unknown>;
    const userId = randomUUID();

    before(async () => {
      // The roots file as the version before made it: records sealed, but not fresh.
      const { db, roots, ...made } = await earlierInstall(kind);
      ({ testDb, rootsFile } = made);
      const file = JSON.parse(fs.readFileSync(rootsFile, 'utf8')) as Record<string, unknown>;
      fs.writeFileSync(
        rootsFile,
        JSON.stringify({ ...file, records_sealed: { at: new Date().toISOString() } }),
      );
      const record = {
        id: userId,
        name: 'v1-chair',
        roles: ['chair'],
        password_hash: await hashPassword('v1 chair password'),
      };
      // The seal of that version: the same fields, without the seq of a change.
      const { sealed_seq: _s, ...fields } = JSON.parse(userSealedText(record)) as Record<string, unknown>;
      const authority_mac = roots.mac('authority', canonicalize({ ...fields, v: 1 })!);
      await db.knex('users').insert({ ...record, roles: JSON.stringify(record.roles), authority_mac });
      v1Row = (await db.knex('users').where({ id: userId }).first()) as Record<string, unknown>;
      await db.close();
    });
    after(async () => {
      await server?.close();
      await testDb?.drop();
    });

    it('seals them again once at the first start, binding the head, and says so in the roots file', async () => {
      const config = loadConfig(testEnv(testDb), testDb.dataDir);
      server = await startSqlServer(config, createLogger('silent'));
      assert.equal(readHostRoots(rootsFile)!.recordsFresh, true);
      const row = await server.sql('users').where({ id: userId }).first();
      assert.notEqual(row.sealed_seq, null, 'bound to the head at the upgrade');
      assert.equal((await new WebClient(server.url).login('v1-chair', 'v1 chair password')).res.status, 303);
    });

    it('refuses the record of that version put back by SQL after the upgrade', async () => {
      const { id: _id, ...columns } = v1Row;
      await server!
        .sql('users')
        .where({ id: userId })
        .update({ ...columns, roles: JSON.stringify(columns.roles) } as Record<string, Knex.Value>);
      assert.equal((await new WebClient(server!.url).login('v1-chair', 'v1 chair password')).res.status, 401);
    });
  });
}
