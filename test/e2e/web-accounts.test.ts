import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createUser } from '../../src/accounts/users.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, initializeStatus, startTestServer, type TestServer } from '../helpers/server.ts';

/** Posts a form whose fields may repeat (role=chair&role=compliance), as a browser sends checkboxes. */
async function postPairs(web: WebClient, path: string, pairs: [string, string][]) {
  const res = await fetch(new URL(path, web.base), {
    method: 'POST',
    redirect: 'manual',
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      cookie: [...web.cookies].map(([k, v]) => `${k}=${v}`).join('; '),
    },
    body: new URLSearchParams(pairs).toString(),
  });
  return { res, html: await res.text() };
}

/** The secret a one-time page shows. */
function secretOf(html: string): string {
  const m = /<code class="secret" id="secret">([^<]+)<\/code>/.exec(html);
  if (!m) throw new Error('no secret on the page');
  return m[1]!;
}

const unescape = (html: string) => html.replaceAll('&quot;', '"').replaceAll('&#39;', "'");

for (const kind of databaseKinds()) {
  describe(`accounts in the web UI on ${kind}`, () => {
    let server: TestServer;
    let admin: WebClient;
    let csrf: string;
    const rows = async (auditKind: string) =>
      (await server.sql('audit_events').where({ kind: auditKind }).orderBy('seq')).map((r) => ({
        ...r,
        details: typeof r.details === 'string' ? JSON.parse(r.details) : r.details,
      })) as { actor: string; agent_id: string | null; details: Record<string, unknown> }[];
    const signedIn = async (name: string, password: string) => {
      const web = new WebClient(server.url);
      const res = (await web.login(name, password)).res;
      return { web, status: res.status };
    };
    const csrfOf = async (web: WebClient) => WebClient.field((await web.get('/approvals')).html, '_csrf');
    const userRoles = async (name: string) => {
      const row = await server.sql('users').where({ name }).first();
      return typeof row.roles === 'string' ? JSON.parse(row.roles) : row.roles;
    };

    before(async () => {
      server = await startTestServer(kind);
      await createUser(server.sql, { name: 'root', roles: ['admin'], password: 'root password' });
      await createUser(server.sql, { name: 'ada', roles: ['chair'], password: 'ada password' });
      // The first run's admin stands aside (as if disabled long ago): root is the one admin here.
      await server.sql('users').where({ name: 'admin' }).update({ disabled_at: new Date() });
      ({ web: admin } = await signedIn('root', 'root password'));
      csrf = await csrfOf(admin);
    });
    after(async () => {
      await server?.stop();
    });

    it('shows an admin every user and agent, linked from the navigation', async () => {
      const home = await admin.get('/approvals');
      assert.match(home.html, /<a href="\/admin\/users">Users<\/a> <a href="\/admin\/agents">Agents<\/a>/);
      const root = await admin.get('/admin');
      assert.equal(root.res.status, 303);
      assert.equal(root.res.headers.get('location'), '/admin/users');

      const users = await admin.get('/admin/users');
      assert.equal(users.res.status, 200);
      for (const [name, roles] of [
        ['root', 'admin'],
        ['ada', 'chair'],
        ['chair', 'chair'],
      ]) {
        assert.match(users.html, new RegExp(`>${name}</a></td>\\s*<td data-label="Roles">${roles}</td>`));
      }
      assert.match(users.html, /<td data-label="State">active<\/td>\s*<td data-label="Created"><time/);

      const agents = await admin.get('/admin/agents');
      assert.equal(agents.res.status, 200);
      assert.match(
        agents.html,
        />demo<\/a><\/td>\s*<td data-label="Owner">—<\/td>\s*<td data-label="Profile">all<\/td>/,
      );
      assert.match(agents.html, /default \(100000\/min\)/);
      assert.doesNotMatch(agents.html, /cs_[A-Za-z0-9_-]{20,}/, 'no token is ever listed');
    });

    it('adds a user with a password shown once, which signs in', async () => {
      const added = await postPairs(admin, '/admin/users', [
        ['_csrf', csrf],
        ['name', 'bea'],
        ['role', 'chair'],
        ['role', 'compliance'],
      ]);
      assert.equal(added.res.status, 200, added.html);
      assert.equal(added.res.headers.get('cache-control'), 'no-store');
      assert.equal(added.res.headers.get('location'), null, 'the password is never in a URL');
      const password = secretOf(added.html);
      assert.match(password, /^[A-Za-z0-9_-]{16}$/);
      assert.match(added.html, /Shown only this once/);

      const created = (await rows('user.created')).at(-1)!;
      assert.equal(created.actor, 'root');
      assert.deepEqual(created.details, { user: 'bea', roles: ['chair', 'compliance'] });

      const bea = await signedIn('bea', password);
      assert.equal(bea.status, 303);
      assert.match((await bea.web.get('/approvals')).html, /bea <small>\(chair, compliance\)<\/small>/);
      const all = JSON.stringify(await server.sql('audit_events').select('details'));
      assert.ok(!all.includes(password), 'no password in the audit log');
    });

    it("changes roles with an audit row naming the admin, and a demoted user's session loses the role", async () => {
      const bea = (await signedIn('bea', await resetPassword('bea'))).web;
      const promote = await postPairs(admin, '/admin/users/bea/roles', [
        ['_csrf', csrf],
        ['role', 'chair'],
        ['role', 'admin'],
      ]);
      assert.equal(promote.res.status, 303);
      assert.equal(promote.res.headers.get('location'), '/admin/users/bea?done=roles');
      assert.match((await admin.get('/admin/users/bea?done=roles')).html, /Roles saved/);
      assert.equal(
        (await bea.get('/admin/users')).res.status,
        200,
        'the promotion holds in the open session',
      );

      const demote = await postPairs(admin, '/admin/users/bea/roles', [
        ['_csrf', csrf],
        ['role', 'compliance'],
      ]);
      assert.equal(demote.res.status, 303);
      assert.equal((await bea.get('/admin/users')).res.status, 403, 'and so does the demotion');
      assert.equal((await bea.get('/audit')).res.status, 200);

      const changes = (await rows('user.role_changed')).slice(-2);
      assert.deepEqual(
        changes.map((r) => [r.actor, r.details]),
        [
          ['root', { user: 'bea', roles_before: ['chair', 'compliance'], roles_after: ['chair', 'admin'] }],
          ['root', { user: 'bea', roles_before: ['chair', 'admin'], roles_after: ['compliance'] }],
        ],
      );
      const recorded = (await rows('user.role_changed')).length;
      const again = await postPairs(admin, '/admin/users/bea/roles', [
        ['_csrf', csrf],
        ['role', 'compliance'],
      ]);
      assert.equal(again.res.headers.get('location'), '/admin/users/bea?done=unchanged');
      assert.equal(
        (await rows('user.role_changed')).length,
        recorded,
        'saving the same roles records nothing',
      );
    });

    /** Resets `name`'s password through the page; returns the new one. */
    async function resetPassword(name: string): Promise<string> {
      const reset = await admin.post(`/admin/users/${name}/password`, { _csrf: csrf });
      assert.equal(reset.res.status, 200, reset.html);
      assert.equal(reset.res.headers.get('cache-control'), 'no-store');
      return secretOf(reset.html);
    }

    it("resets a password: the old one is refused, the new one works, the user's sessions end", async () => {
      const old = await resetPassword('bea');
      const bea = (await signedIn('bea', old)).web;
      assert.equal((await bea.get('/approvals')).res.status, 200);
      const before = (await rows('user.password_reset')).length;

      const fresh = await resetPassword('bea');
      assert.notEqual(fresh, old);
      assert.equal((await bea.get('/approvals')).res.status, 303, 'the open session has ended');
      assert.equal((await signedIn('bea', old)).status, 401);
      assert.equal((await signedIn('bea', fresh)).status, 303);

      const resets = await rows('user.password_reset');
      assert.equal(resets.length, before + 1);
      assert.equal(resets.at(-1)!.actor, 'root');
      assert.deepEqual(resets.at(-1)!.details, { user: 'bea' });
      const all = JSON.stringify(await server.sql('audit_events').select('details'));
      assert.ok(!all.includes(fresh) && !all.includes(old), 'no password in the audit log');
    });

    it('sets and clears an e-mail address, audited', async () => {
      const set = await admin.post('/admin/users/ada/email', { _csrf: csrf, email: 'ada@example.org' });
      assert.equal(set.res.status, 303);
      assert.match((await admin.get('/admin/users')).html, /<td data-label="E-mail">ada@example.org<\/td>/);
      const cleared = await admin.post('/admin/users/ada/email', { _csrf: csrf, email: '' });
      assert.equal(cleared.res.status, 303);
      assert.deepEqual(
        (await rows('user.email_changed')).map((r) => [r.actor, r.details]),
        [
          ['root', { user: 'ada', email_before: null, email_after: 'ada@example.org' }],
          ['root', { user: 'ada', email_before: 'ada@example.org', email_after: null }],
        ],
      );
      const bad = await admin.post('/admin/users/ada/email', { _csrf: csrf, email: 'not an address' });
      assert.equal(bad.res.status, 400);
      assert.match(bad.html, /class="error" role="alert">email: /);
      assert.equal((await rows('user.email_changed')).length, 2);
    });

    it('disables a user: their open session stops working at once, and sign-in is refused', async () => {
      await createUser(server.sql, { name: 'cy', roles: ['chair'], password: 'cy password' });
      const cy = (await signedIn('cy', 'cy password')).web;
      assert.equal((await cy.get('/approvals')).res.status, 200);

      const disabled = await admin.post('/admin/users/cy/disable', { _csrf: csrf });
      assert.equal(disabled.res.status, 303);
      assert.match((await admin.get('/admin/users/cy?done=disabled')).html, /User disabled/);
      const page = await cy.get('/approvals');
      assert.equal(page.res.status, 303);
      assert.match(page.res.headers.get('location')!, /^\/login/);
      assert.equal((await signedIn('cy', 'cy password')).status, 401);
      assert.match(
        (await admin.get('/admin/users')).html,
        />cy<\/a><\/td>[^]*?<td data-label="State">disabled <time/,
      );

      const [row] = await rows('user.disabled');
      assert.equal(row!.actor, 'root');
      assert.deepEqual(row!.details, { user: 'cy' });
    });

    it('adds an agent with a token shown once, and changes its profile and rate limit', async () => {
      const added = await admin.post('/admin/agents', {
        _csrf: csrf,
        name: 'helper',
        profile: 'all',
        owner: 'ada',
        rate_limit_per_min: '30',
      });
      assert.equal(added.res.status, 200, added.html);
      assert.equal(added.res.headers.get('cache-control'), 'no-store');
      const token = secretOf(added.html);
      assert.match(token, /^cs_/);
      assert.equal(await initializeStatus(server, token), 200);
      const created = (await rows('agent.created')).at(-1)!;
      assert.equal(created.actor, 'root');
      const ada = (await server.sql('users').where({ name: 'ada' }).first()) as { id: string };
      assert.deepEqual(created.details, {
        agent: 'helper',
        agent_name: 'helper',
        profile: 'all',
        owner: 'ada',
        owner_id: ada.id,
        rate_limit_per_min: 30,
      });

      const changed = await admin.post('/admin/agents/helper/settings', {
        _csrf: csrf,
        profile: 'readonly',
        rate_limit_per_min: '',
      });
      assert.equal(changed.res.status, 303);
      assert.equal(changed.res.headers.get('location'), '/admin/agents/helper?done=settings');
      const page = await admin.get('/admin/agents/helper?done=settings');
      assert.match(page.html, /Saved\./);
      assert.match(page.html, /<dt>Profile<\/dt><dd>readonly<\/dd>/);
      const id = (await server.sql('agents').where({ name: 'helper' }).first()).id;
      assert.deepEqual(
        [...(await rows('agent.profile_changed')), ...(await rows('agent.rate_limit_changed'))].map((r) => [
          r.actor,
          r.agent_id,
          r.details,
        ]),
        [
          ['root', id, { agent: 'helper', agent_name: 'helper', before: 'all', after: 'readonly' }],
          ['root', id, { agent: 'helper', agent_name: 'helper', before: 30, after: null }],
        ],
      );
      assert.ok(!JSON.stringify(await rows('agent.created')).includes(token), 'no token in the audit log');
    });

    it('rotates an agent token: the old one is refused at once on /mcp, the new one accepted', async () => {
      const added = await admin.post('/admin/agents', { _csrf: csrf, name: 'rotor', profile: 'all' });
      const oldToken = secretOf(added.html);
      const client = await connectHttp(server.url, oldToken);
      assert.equal((await call(client, 'isphere_search_groups', { query: 'board' })).ok, true);
      await client.close();

      const rotated = await admin.post('/admin/agents/rotor/rotate', { _csrf: csrf });
      assert.equal(rotated.res.status, 200, rotated.html);
      assert.equal(rotated.res.headers.get('cache-control'), 'no-store');
      const newToken = secretOf(rotated.html);
      assert.notEqual(newToken, oldToken);
      assert.equal(await initializeStatus(server, oldToken), 401, 'the old token is refused at once');
      const fresh = await connectHttp(server.url, newToken);
      assert.equal((await call(fresh, 'isphere_search_groups', { query: 'board' })).ok, true);
      await fresh.close();

      const [row] = await rows('agent.token_rotated');
      const id = (await server.sql('agents').where({ name: 'rotor' }).first()).id;
      assert.equal(row!.actor, 'root');
      assert.equal(row!.agent_id, id);
      assert.deepEqual(row!.details, { agent: 'rotor', agent_name: 'rotor' });
    });

    it('revokes an agent: its token is refused, and it can no longer be rotated', async () => {
      const added = await admin.post('/admin/agents', { _csrf: csrf, name: 'gone' });
      const token = secretOf(added.html);
      const revoked = await admin.post('/admin/agents/gone/revoke', { _csrf: csrf });
      assert.equal(revoked.res.status, 303);
      assert.equal(await initializeStatus(server, token), 401);
      const page = await admin.get('/admin/agents/gone?done=revoked');
      assert.match(page.html, /Agent revoked/);
      assert.doesNotMatch(page.html, /Rotate token/);
      const [row] = await rows('agent.revoked');
      assert.equal(row!.actor, 'root');
      assert.deepEqual(row!.details, { agent: 'gone', agent_name: 'gone' });

      const rotate = await admin.post('/admin/agents/gone/rotate', { _csrf: csrf });
      assert.equal(rotate.res.status, 404);
      assert.match(unescape(rotate.html), /no active agent named "gone"/);
      assert.equal((await rows('agent.token_rotated')).length, 1, 'only the rotation of the test before');
    });

    it('refuses the pages to anyone but an admin', async () => {
      const visitor = new WebClient(server.url);
      const bounced = await visitor.get('/admin/users');
      assert.equal(bounced.res.status, 303);
      assert.equal(bounced.res.headers.get('location'), `/login?next=${encodeURIComponent('/admin/users')}`);

      const chair = (await signedIn('ada', 'ada password')).web;
      const token = await csrfOf(chair);
      assert.doesNotMatch(
        (await chair.get('/approvals')).html,
        /href="\/admin\/users"/,
        'no link for a chair',
      );
      for (const path of [
        '/admin',
        '/admin/users',
        '/admin/agents',
        '/admin/users/root',
        '/admin/agents/demo',
      ]) {
        const page = await chair.get(path);
        assert.equal(page.res.status, 403, path);
        assert.match(page.html, /Users and agents are managed by admin users/);
      }
      const forged = await postPairs(chair, '/admin/users', [
        ['_csrf', token],
        ['name', 'mallory'],
        ['role', 'admin'],
      ]);
      assert.equal(forged.res.status, 403);
      assert.equal((await chair.post('/admin/users/root/disable', { _csrf: token })).res.status, 403);
      assert.equal(await server.sql('users').where({ name: 'mallory' }).first(), undefined);
      assert.deepEqual(await userRoles('root'), ['admin']);
    });

    it('refuses a form without the session CSRF token, and changes nothing', async () => {
      const before = (await rows('user.created')).length;
      const forms: Record<string, string>[] = [
        { name: 'nocsrf', role: 'chair' },
        { _csrf: 'forged', name: 'nocsrf', role: 'chair' },
      ];
      for (const form of forms) {
        const refused = await admin.post('/admin/users', form);
        assert.equal(refused.res.status, 403);
        assert.match(refused.html, /The form was not accepted/);
      }
      assert.equal((await admin.post('/admin/agents/demo/rotate', {})).res.status, 403);
      assert.equal((await rows('user.created')).length, before);
      assert.equal((await rows('agent.token_rotated')).length, 1);
      assert.equal(await server.sql('users').where({ name: 'nocsrf' }).first(), undefined);
    });

    it('refuses to demote or disable the last active admin, saying why', async () => {
      const roleRows = (await rows('user.role_changed')).length;
      const demote = await postPairs(admin, '/admin/users/root/roles', [
        ['_csrf', csrf],
        ['role', 'chair'],
      ]);
      assert.equal(demote.res.status, 409);
      assert.match(
        unescape(demote.html),
        /class="error" role="alert">"root" is the last active admin: add another admin first/,
      );
      const disable = await admin.post('/admin/users/root/disable', { _csrf: csrf });
      assert.equal(disable.res.status, 409);
      assert.match(unescape(disable.html), /"root" is the last active admin/);
      assert.deepEqual(await userRoles('root'), ['admin']);
      assert.equal((await rows('user.role_changed')).length, roleRows);
      assert.equal((await rows('user.disabled')).length, 1, 'only cy, disabled before');
      assert.equal((await admin.get('/admin/users')).res.status, 200, 'root is still signed in and admin');
    });

    it('refuses a bad role, a bad name, a taken name, an unknown user and a bad profile, changing nothing', async () => {
      const counts = async () =>
        Promise.all(
          ['user.created', 'user.role_changed', 'agent.created', 'agent.profile_changed'].map(
            async (k) => (await rows(k)).length,
          ),
        );
      const before = await counts();

      const badRole = await postPairs(admin, '/admin/users/ada/roles', [
        ['_csrf', csrf],
        ['role', 'emperor'],
      ]);
      assert.equal(badRole.res.status, 400);
      assert.match(
        unescape(badRole.html),
        /class="error" role="alert">roles\.0: Invalid option: expected one of "chair"\|"compliance"\|"admin"/,
      );
      const noRole = await admin.post('/admin/users', { _csrf: csrf, name: 'dora' });
      assert.equal(noRole.res.status, 400);
      assert.match(noRole.html, /class="error" role="alert">Choose at least one role\./);
      assert.match(noRole.html, /value="dora"/, 'the form keeps what was typed');
      const badName = await admin.post('/admin/users', { _csrf: csrf, name: 'no spaces', role: 'chair' });
      assert.equal(badName.res.status, 400);
      assert.match(badName.html, /name: letters, digits, dot, dash, @ and underscore/);
      const taken = await admin.post('/admin/users', { _csrf: csrf, name: 'ada', role: 'chair' });
      assert.equal(taken.res.status, 409);
      assert.match(unescape(taken.html), /a user named "ada" already exists/);
      assert.doesNotMatch(taken.html, /class="secret"/, 'no password is shown for a refused user');

      const unknown = await admin.post('/admin/users/nobody/roles', { _csrf: csrf, role: 'chair' });
      assert.equal(unknown.res.status, 404);
      assert.match(unknown.html, /There is no user nobody/);
      assert.equal((await admin.get('/admin/agents/nobody')).res.status, 404);

      const badProfile = await admin.post('/admin/agents/helper/settings', { _csrf: csrf, profile: 'nope' });
      assert.equal(badProfile.res.status, 404);
      assert.match(unescape(badProfile.html), /no profile "nope" \(installed: all, drafting, readonly\)/);
      const badRate = await admin.post('/admin/agents', {
        _csrf: csrf,
        name: 'fast',
        rate_limit_per_min: 'lots',
      });
      assert.equal(badRate.res.status, 400);
      assert.match(badRate.html, /rate_limit_per_min: /);
      assert.match(badRate.html, /value="lots"/);

      assert.deepEqual(await counts(), before);
      assert.deepEqual(await userRoles('ada'), ['chair']);
    });
  });
}
