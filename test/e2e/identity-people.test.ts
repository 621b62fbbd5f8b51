import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Knex } from 'knex';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser, setUserEmail } from '../../src/accounts/users.ts';
import { isDecisionRefusal } from '../../src/approval/decide.ts';
import { isAppError } from '../../src/core/errors.ts';
import type { User } from '../../src/core/identity.ts';
import { MigrationSource } from '../../src/db/migrations.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds, openMigratedDatabase } from '../helpers/db.ts';
import { CALLBACK, oidcEnv, signInAt } from '../helpers/oidc-flow.ts';
import { freePort, startOpenIdProvider, type OpenIdProvider } from '../helpers/openid-provider.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/** The provider's people: account id (their subject) → claims. */
const PEOPLE = {
  // Someone at the provider whose user name is the local owner's, in other letters.
  'sub-capital': { preferred_username: 'Mallory', groups: ['cs-chairs'] },
  // Someone whose claims carry the owner's address, not vouched for: the claim missing, or false.
  'sub-unsure': { preferred_username: 'mal-unsure', email: 'mallory@example.com', groups: ['cs-chairs'] },
  'sub-denied': {
    preferred_username: 'mal-denied',
    email: 'mallory@example.com',
    email_verified: false,
    groups: ['cs-chairs'],
  },
  // The owner herself, whose address the provider verified.
  'sub-mallory': {
    preferred_username: 'mallory.s',
    email: 'Mallory@Example.com',
    email_verified: true,
    groups: ['cs-chairs'],
  },
  // Otto at the provider, with nothing that would link him by himself: an admin links him.
  'sub-otto': { preferred_username: 'otto.k', groups: ['cs-chairs'] },
};

interface Row {
  kind: string;
  actor: string | null;
  details: unknown;
}

for (const kind of databaseKinds()) {
  describe(`people, not spellings: single sign-on and the owner rule on ${kind}`, () => {
    let idp: OpenIdProvider;
    let server: TestServer;
    const tokens: Record<string, string> = {};
    const knex = () => server.sql;
    const head = async () => Number((await knex()('audit_events').max({ s: 'seq' }).first())?.s);
    const rowsSince = (seq: number, kinds: string[]) =>
      knex()('audit_events').where('seq', '>', seq).whereIn('kind', kinds).orderBy('seq') as Promise<Row[]>;
    const signIn = (account: keyof typeof PEOPLE) => signInAt(server, idp, account);
    const statusOf = async (id: string) =>
      ((await knex()('approval_requests').where({ id }).first()) as { status: string }).status;

    /** A request of `agent` waiting for a chair. */
    async function draft(agent: string, content_text: string): Promise<string> {
      const client = await connectHttp(server.url, tokens[agent]!);
      try {
        const res = await call(client, 'isphere_send_message', {
          target_type: 'contact',
          target_id: 'ct_alice',
          content_text,
        });
        return res.approval.approval_request_id as string;
      } finally {
        await client.close();
      }
    }

    /** `web` (signed in) approves request `id` in the web form; the answer's status. */
    async function approveIn(web: WebClient, id: string): Promise<number> {
      const page = await web.get(`/approvals/${id}`);
      assert.equal(page.res.status, 200, page.html);
      const post = await web.post(`/approvals/${id}/decision`, {
        decision: 'approve',
        _csrf: WebClient.field(page.html, '_csrf'),
      });
      return post.res.status;
    }

    before(async () => {
      const port = await freePort();
      idp = await startOpenIdProvider({
        redirectUris: [`http://127.0.0.1:${port}${CALLBACK}`],
        host: 'localhost',
      });
      for (const [id, claims] of Object.entries(PEOPLE)) idp.accounts.set(id, claims);
      server = await startTestServer(kind, oidcEnv(idp.issuer, port));
      await createUser(knex(), { name: 'mallory', roles: ['chair'], password: 'mallory password' });
      // Set as the account pages set it (sealed): an address written by SQL alone refuses her.
      await knex().transaction((trx) => setUserEmail(trx, 'mallory', 'mallory@example.com'));
      await createUser(knex(), { name: 'otto', roles: ['chair'], password: 'otto password' });
      await createUser(knex(), { name: 'ada', roles: ['chair'], password: 'ada password' });
      tokens['mallory-bot'] = (await createAgent(knex(), { name: 'mallory-bot', owner: 'mallory' })).token;
      tokens['otto-bot'] = (await createAgent(knex(), { name: 'otto-bot', owner: 'otto' })).token;
    });
    after(async () => {
      await server?.stop();
      await idp?.close();
    });

    it('refuses an SSO account named "Mallory" beside the local user mallory: not linked, no user made', async () => {
      const run = await signIn('sub-capital');
      assert.equal(run.done.res.status, 403, run.done.html);
      assert.match(run.done.html, /reason: name_taken/);
      assert.equal(run.web.cookies.has('cs_session'), false);
      const named = await knex()('users').whereRaw("lower(name) = 'mallory'");
      assert.deepEqual(
        named.map((u: { name: string; oidc_subject: string | null }) => [u.name, u.oidc_subject]),
        [['mallory', null]],
      );
    });

    it("does not link an SSO account carrying the owner's e-mail that the provider does not verify", async () => {
      for (const account of ['sub-unsure', 'sub-denied'] as const) {
        const since = await head();
        const run = await signIn(account);
        assert.equal(run.done.res.status, 403, `${account}: ${run.done.html}`);
        assert.match(run.done.html, /reason: email_unverified/);
        assert.equal(run.web.cookies.has('cs_session'), false);
        const [failed] = await rowsSince(since, ['user.login_failed', 'user.login', 'user.linked']);
        assert.equal(failed?.kind, 'user.login_failed');
        assert.equal((detailsOf(failed) as { reason: string }).reason, 'email_unverified');
        assert.equal(await knex()('users').where({ oidc_subject: account }).first(), undefined);
      }
      const mallory = (await knex()('users').where({ name: 'mallory' }).first()) as { oidc_subject: unknown };
      assert.equal(mallory.oidc_subject, null, 'mallory is linked to nobody');
    });

    it('links the owner by her verified e-mail (audited): signed in through SSO she still may not approve her agent', async () => {
      const since = await head();
      const run = await signIn('sub-mallory');
      assert.equal(run.done.res.status, 200, run.done.html);
      assert.match(run.done.html, /Signed in as mallory through/);
      const rows = await rowsSince(since, ['user.linked', 'user.created', 'user.login']);
      assert.deepEqual(
        rows.map((r) => [r.kind, r.actor]),
        [
          ['user.linked', `oidc:${idp.issuer}`],
          ['user.login', 'mallory'],
        ],
      );
      assert.deepEqual(detailsOf(rows[0]!), {
        user: 'mallory',
        email: 'Mallory@Example.com',
        via: 'oidc',
        issuer: idp.issuer,
        subject: 'sub-mallory',
      });

      const id = await draft('mallory-bot', 'approve my own request, through the side door');
      assert.equal(await approveIn(run.web, id), 403);
      assert.equal(await statusOf(id), 'pending');
      const ada = new WebClient(server.url);
      await ada.login('ada', 'ada password');
      assert.equal(await approveIn(ada, id), 303, 'another person may');
      assert.equal(await statusOf(id), 'approved');
    });

    it('links an identity by `countersign user link` (audited): otto through SSO may not approve his agent', async () => {
      const since = await head();
      const linked = await runCli(['user', 'link', 'Otto', '--subject', 'sub-otto'], server.env);
      assert.equal(linked.code, 0, linked.stderr);
      const [row, ...more] = await rowsSince(since, ['user.linked']);
      assert.equal(more.length, 0);
      assert.match(row!.actor!, /^cli:.+@.+/);
      assert.deepEqual(detailsOf(row!), {
        user: 'otto',
        issuer: idp.issuer,
        subject: 'sub-otto',
        via: 'cli',
      });

      const again = await runCli(['user', 'link', 'otto', '--subject', 'sub-otto'], server.env);
      assert.equal(again.code, 0, 'linking it again changes nothing');
      assert.equal((await rowsSince(since, ['user.linked'])).length, 1, 'and records nothing');
      const taken = await runCli(['user', 'link', 'ada', '--subject', 'sub-otto'], server.env);
      assert.equal(taken.code, 1, 'an identity signs in as one user');
      const nobody = await runCli(['user', 'link', 'nobody', '--subject', 'sub-x'], server.env);
      assert.equal(nobody.code, 1, 'an unknown user');

      const run = await signIn('sub-otto');
      assert.equal(run.done.res.status, 200, run.done.html);
      assert.match(run.done.html, /Signed in as otto through/);
      const id = await draft('otto-bot', "otto's own request");
      assert.equal(await approveIn(run.web, id), 403);
      assert.equal(await statusOf(id), 'pending');
    });

    it('lets nobody decide the requests of an agent whose owner names no user, until an owner is set', async () => {
      const { token, agent } = await createAgent(knex(), { name: 'orphan-bot' });
      tokens['orphan-bot'] = token;
      // What the owner migration leaves for an owner name that matched no user.
      await knex()('agents').where({ id: agent.id }).update({ owner_unresolved: 'ghost' });
      const id = await draft('orphan-bot', 'whose is this?');
      const ada = (await knex()('users').where({ name: 'ada' }).first()) as User & { roles: unknown };
      const user: User = { id: ada.id, name: 'ada', roles: ['chair'] };
      const decide = () => server.services.approvals.decide({ id, user, decision: 'approve' });
      await assert.rejects(decide(), (err) => isDecisionRefusal(err) && err.reason === 'owner_unresolved');
      assert.equal(await statusOf(id), 'pending');

      const set = await runCli(['agent', 'set', 'orphan-bot', '--owner', 'otto'], server.env);
      assert.equal(set.code, 0, set.stderr);
      assert.equal((await decide()).status, 'approved');
    });
  });

  describe(`people, not spellings: user names and owners at the command line on ${kind}`, () => {
    let server: TestServer;
    const cli = (args: string[], input?: string) =>
      runCli(args, server.env, input === undefined ? {} : { input });
    const knex = () => server.sql;
    const rows = (kind: string) => knex()('audit_events').where({ kind }).orderBy('seq') as Promise<Row[]>;

    before(async () => {
      server = await startTestServer(kind);
      assert.equal((await cli(['user', 'add', 'mallory', '--role', 'chair'], 'mallory-password\n')).code, 0);
      assert.equal((await cli(['user', 'add', 'ada', '--role', 'chair'], 'ada-password-1\n')).code, 0);
    });
    after(async () => {
      await server?.stop();
    });

    it('refuses a user name that differs from an existing one only in case', async () => {
      const res = await cli(['user', 'add', 'Mallory', '--role', 'chair'], 'another-password\n');
      assert.equal(res.code, 1, res.stdout);
      assert.match(res.stderr, /mallory/);
      await assert.rejects(
        createUser(knex(), { name: 'MALLORY', roles: ['chair'], password: 'yet another one' }),
        (err) => isAppError(err, 'CONFLICT', 'user_exists'),
      );
      const named = await knex()('users').whereRaw("lower(name) = 'mallory'");
      assert.deepEqual(
        named.map((u: { name: string }) => u.name),
        ['mallory'],
      );
    });

    it('refuses `agent add --owner` naming no user, and records an existing owner by id', async () => {
      const res = await cli(['agent', 'add', 'ghost-bot', '--owner', 'ghost']);
      assert.equal(res.code, 1, res.stdout);
      assert.equal(await knex()('agents').where({ name: 'ghost-bot' }).first(), undefined, 'no agent');
      await assert.rejects(createAgent(knex(), { name: 'ghost-bot-2', owner: 'ghost' }), (err) =>
        isAppError(err, 'NOT_FOUND', 'unknown_owner'),
      );

      const ok = await cli(['agent', 'add', 'mallory-bot', '--owner', 'MALLORY']);
      assert.equal(ok.code, 0, ok.stderr);
      const mallory = (await knex()('users').where({ name: 'mallory' }).first()) as { id: string };
      const agent = (await knex()('agents').where({ name: 'mallory-bot' }).first()) as {
        id: string;
        owner_id: string;
      };
      assert.equal(agent.owner_id, mallory.id);
      const created = (await rows('agent.created')).find(
        (r) => (detailsOf(r) as { agent: string }).agent === 'mallory-bot',
      );
      assert.deepEqual(
        [
          (detailsOf(created!) as { owner: string }).owner,
          (detailsOf(created!) as { owner_id: string }).owner_id,
        ],
        ['mallory', mallory.id],
      );
      const listed = await cli(['agent', 'list']);
      assert.match(listed.stdout, /^mallory-bot\t.*\towner=mallory\t/m);
    });

    it('changes an owner with `agent set --owner` (an existing user, audited), and clears it with "none"', async () => {
      assert.equal((await cli(['agent', 'add', 'shared-bot', '--owner', 'mallory'])).code, 0);
      const unknown = await cli(['agent', 'set', 'shared-bot', '--owner', 'ghost']);
      assert.equal(unknown.code, 1, 'an owner must exist');
      assert.equal((await rows('agent.owner_changed')).length, 0, 'nothing changed, nothing recorded');

      const set = await cli(['agent', 'set', 'shared-bot', '--owner', 'Ada']);
      assert.equal(set.code, 0, set.stderr);
      const [mallory, ada] = (await knex()('users')
        .whereIn('name', ['mallory', 'ada'])
        .orderBy('name', 'desc')) as {
        id: string;
      }[];
      const agent = (await knex()('agents').where({ name: 'shared-bot' }).first()) as {
        id: string;
        owner_id: string | null;
      };
      assert.equal(agent.owner_id, ada!.id);
      const cleared = await cli(['agent', 'set', 'shared-bot', '--owner', 'none']);
      assert.equal(cleared.code, 0, cleared.stderr);
      assert.equal(
        ((await knex()('agents').where({ id: agent.id }).first()) as { owner_id: unknown }).owner_id,
        null,
      );
      const changes = await rows('agent.owner_changed');
      assert.deepEqual(
        changes.map((r) => detailsOf(r)),
        [
          {
            agent: 'shared-bot',
            agent_name: 'shared-bot',
            before: 'mallory',
            before_id: mallory!.id,
            after: 'ada',
            after_id: ada!.id,
          },
          {
            agent: 'shared-bot',
            agent_name: 'shared-bot',
            before: 'ada',
            before_id: ada!.id,
            after: null,
            after_id: null,
          },
        ],
      );
    });
  });

  describe(`people, not spellings: the migrations on ${kind}`, () => {
    const FIRST = '20261205130000-users-name-unique-ignoring-case';
    const source = new MigrationSource();

    /** Undoes the identity migrations (and any after them), as before they landed. */
    async function rollBackPast(knex: Knex, name: string): Promise<void> {
      for (;;) {
        const [done] = (await knex.migrate.list({ migrationSource: source })) as [{ name: string }[]];
        if (!done.some((m) => m.name === name)) return;
        await knex.migrate.down({ migrationSource: source });
      }
    }
    const user = (name: string) => ({
      id: crypto.randomUUID(),
      name,
      roles: JSON.stringify(['chair']),
      password_hash: 'scrypt$x',
    });
    const agent = (name: string, owner: string | null) => ({
      id: crypto.randomUUID(),
      name,
      token_hash: `hash-of-${name}`,
      owner,
    });

    it('refuses to make names unique ignoring case while two differ only in case, naming them', async () => {
      const { testDb, db } = await openMigratedDatabase(kind);
      try {
        await rollBackPast(db.knex, FIRST);
        await db.knex('users').insert([user('mallory'), user('Mallory'), user('ada')]);
        await assert.rejects(db.knex.migrate.latest({ migrationSource: source }), (err: Error) => {
          assert.match(err.message, /Mallory, mallory/);
          assert.doesNotMatch(err.message, /ada/);
          return true;
        });
        await db.knex('users').where({ name: 'Mallory' }).update({ name: 'mallory-2' });
        await db.knex.migrate.latest({ migrationSource: source });
        await assert.rejects(db.knex('users').insert(user('ADA')), 'the index refuses a second ada');
      } finally {
        await db.close();
        await testDb.drop();
      }
    });

    it('turns owner names into user ids ignoring case, and keeps a name that matches no user as unresolved', async () => {
      const { testDb, db } = await openMigratedDatabase(kind);
      try {
        await rollBackPast(db.knex, FIRST);
        const mallory = user('mallory');
        await db.knex('users').insert(mallory);
        await db
          .knex('agents')
          .insert([
            agent('exact', 'mallory'),
            agent('shouting', 'MALLORY'),
            agent('ghostly', 'ghost'),
            agent('free', null),
          ]);
        await db.knex.migrate.latest({ migrationSource: source });
        const rows = (await db
          .knex('agents')
          .select('name', 'owner_id', 'owner_unresolved')
          .orderBy('name')) as { name: string; owner_id: string | null; owner_unresolved: string | null }[];
        assert.deepEqual(
          rows.map((r) => [r.name, r.owner_id, r.owner_unresolved]),
          [
            ['exact', mallory.id, null],
            ['free', null, null],
            ['ghostly', null, 'ghost'],
            ['shouting', mallory.id, null],
          ],
        );
      } finally {
        await db.close();
        await testDb.drop();
      }
    });
  });
}
