import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import type { Browser } from 'playwright-core';
import { identityOf } from '../../src/accounts/oidc-users.ts';
import { changeUser, checkCredentials, createUser } from '../../src/accounts/users.ts';
import { configDigest, redactedConfig } from '../../src/app/config-digest.ts';
import { loadConfig, OidcSchema } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import { launchChromium, withoutChromium } from '../helpers/chromium.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { databaseKinds } from '../helpers/db.ts';
import { CLIENT_ID, freePort, startOpenIdProvider, type OpenIdProvider } from '../helpers/openid-provider.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';
import { CALLBACK, oidcEnv, reachCallbackAt, signInAt, type FlowOptions } from '../helpers/oidc-flow.ts';

/** The provider's people: account id (their subject) → claims. */
const PEOPLE = {
  'sub-cora': {
    preferred_username: 'cora',
    email: 'cora@example.com',
    email_verified: true,
    groups: ['cs-chairs'],
  },
  'sub-ines': {
    preferred_username: 'ines',
    email: 'ines@example.com',
    email_verified: true,
    groups: ['cs-audit', 'staff'],
  },
  'sub-noah': { preferred_username: 'noah', groups: ['staff'] },
  'sub-rosa': { preferred_username: 'rosa', groups: ['cs-chairs'] },
  'sub-lena': { preferred_username: 'lena', groups: ['cs-chairs'] },
  'sub-dora': { preferred_username: 'dora', groups: ['cs-chairs'] },
  'sub-gil': { email: 'gil@example.com', email_verified: true, groups: ['cs-chairs', 'cs-audit'] },
  'sub-vera': { email: 'vera@example.com', email_verified: false, groups: ['cs-chairs'] },
  'sub-kim': { email: 'kim@example.com', groups: ['cs-chairs'] },
  'sub-tess': { preferred_username: 'tess', groups: ['cs-chairs'] },
  'sub-ravi': { preferred_username: 'ravi', groups: ['cs-chairs'] },
};

/** jsonb comes back parsed (pg) or as text (PGlite). */
const rolesOf = (raw: unknown): unknown => (typeof raw === 'string' ? JSON.parse(raw) : raw);

interface Row {
  seq: number;
  kind: string;
  actor: string | null;
  result: string | null;
  details: Record<string, unknown>;
}

/** The audit rows of some kinds appended after `seq`, oldest first. */
async function auditRowsSince(server: TestServer, seq: number, kinds: string[]): Promise<Row[]> {
  const rows = (await server
    .sql('audit_events')
    .where('seq', '>', seq)
    .whereIn('kind', kinds)
    .orderBy('seq')) as (Omit<Row, 'details'> & { details: unknown })[];
  return rows.map((r) => ({
    ...r,
    seq: Number(r.seq),
    details: (typeof r.details === 'string' ? JSON.parse(r.details) : r.details) as Record<string, unknown>,
  }));
}

const auditHead = async (server: TestServer) =>
  Number((await server.sql('audit_events').max({ s: 'seq' }).first())?.s);

for (const kind of databaseKinds()) {
  describe(`single sign-on for the web UI on ${kind}`, () => {
    let idp: OpenIdProvider;
    let server: TestServer;

    before(async () => {
      const port = await freePort();
      // localhost: another site than the server's 127.0.0.1, so the browser crosses sites as with a real provider.
      idp = await startOpenIdProvider({
        redirectUris: [`http://127.0.0.1:${port}${CALLBACK}`],
        host: 'localhost',
      });
      for (const [id, claims] of Object.entries(PEOPLE)) idp.accounts.set(id, claims);
      server = await startTestServer(kind, oidcEnv(idp.issuer, port));
    });
    after(async () => {
      await server?.stop();
      await idp?.close();
    });

    const rowsSince = (seq: number, kinds: string[]) => auditRowsSince(server, seq, kinds);
    const head = () => auditHead(server);
    const userRow = (name: string) => server.sql('users').where({ name }).first();
    const reachCallback = (account: string | undefined, opts: FlowOptions = {}) =>
      reachCallbackAt(server, idp, account, opts);
    const signIn = (account: string | undefined, opts: FlowOptions = {}) =>
      signInAt(server, idp, account, opts);

    /** A refusal: its status and page, no session, and exactly one user.login_failed row with its reason. */
    async function assertRefused(
      run: Awaited<ReturnType<typeof signIn>>,
      since: number,
      status: number,
      reason: string,
    ) {
      assert.equal(run.done.res.status, status, run.done.html);
      assert.match(run.done.html, new RegExp(`reason: ${reason}`));
      assert.equal(run.web.cookies.has('cs_session'), false, 'no session');
      const rows = await rowsSince(since, ['user.login', 'user.login_failed']);
      assert.deepEqual(
        rows.map((r) => [r.kind, r.result, r.details.via, r.details.issuer, r.details.reason]),
        [['user.login_failed', 'error', 'oidc', idp.issuer, reason]],
      );
      return rows[0]!;
    }

    it('offers "Sign in with Example ID" on the login page, carrying next', async () => {
      const page = await new WebClient(server.url).get('/login?next=%2Faudit');
      assert.match(page.html, /<a href="\/login\/oidc\?next=%2Faudit">Sign in with Example ID<\/a>/);
    });

    it('starts with PKCE S256, a random state and nonce, kept in a sealed HttpOnly cookie for the callback only', async () => {
      const web = new WebClient(server.url);
      const one = await web.get('/login/oidc');
      const two = await web.get('/login/oidc');
      const [a, b] = [one, two].map((r) => new URL(r.res.headers.get('location')!));
      assert.equal(a!.origin, idp.issuer);
      assert.equal(a!.searchParams.get('response_type'), 'code');
      assert.equal(a!.searchParams.get('client_id'), CLIENT_ID);
      assert.equal(a!.searchParams.get('redirect_uri'), `${server.url}${CALLBACK}`);
      assert.equal(a!.searchParams.get('scope'), 'openid email profile groups');
      assert.equal(a!.searchParams.get('code_challenge_method'), 'S256');
      for (const p of ['state', 'nonce', 'code_challenge']) {
        assert.match(a!.searchParams.get(p)!, /^[\w-]{43,}$/);
        assert.notEqual(a!.searchParams.get(p), b!.searchParams.get(p), `${p} is new for every attempt`);
      }
      const cookie = one.setCookies.find((c) => c.startsWith('cs_oidc='))!;
      assert.match(cookie, /HttpOnly/i);
      assert.match(cookie, /SameSite=Lax/i);
      assert.match(cookie, new RegExp(`Path=${CALLBACK}`));
      assert.match(cookie, /Max-Age=600/);
      for (const p of ['state', 'nonce'])
        assert.ok(!cookie.includes(a!.searchParams.get(p)!), `${p} is sealed`);
    });

    it('creates the user on the first sign-in (audited with the provider as actor), and not on the second', async () => {
      const since = await head();
      const first = await signIn('sub-ines', { next: '/audit' });
      assert.equal(first.done.res.status, 200);
      assert.equal(first.done.res.headers.get('refresh'), '0; url=/audit', 'next is carried through');
      assert.match(first.done.html, /Signed in as ines through Example ID/);
      const session = first.done.setCookies.find((c) => c.startsWith('cs_session='))!;
      assert.match(session, /HttpOnly/i);
      assert.match(session, /SameSite=Strict/i);
      assert.equal(
        first.done.setCookies.some((c) => /^cs_oidc=;/.test(c)),
        true,
        'the attempt is spent',
      );

      const row = (await userRow('ines')) as Record<string, unknown>;
      assert.deepEqual(
        [row.password_hash, row.oidc_issuer, row.oidc_subject, row.email],
        [null, idp.issuer, 'sub-ines', 'ines@example.com'],
        'no password',
      );
      await signIn('sub-ines');
      const rows = await rowsSince(since, ['user.created', 'user.role_changed', 'user.login']);
      assert.deepEqual(
        rows.map((r) => [r.kind, r.actor]),
        [
          ['user.created', `oidc:${idp.issuer}`],
          ['user.login', 'ines'],
          ['user.login', 'ines'],
        ],
      );
      assert.deepEqual(rows[0]!.details, {
        user: 'ines',
        roles: ['compliance'],
        email: 'ines@example.com',
        via: 'oidc',
        issuer: idp.issuer,
        subject: 'sub-ines',
      });
      assert.deepEqual(
        { ...rows[1]!.details, ip: 'ip' },
        { ip: 'ip', via: 'oidc', issuer: idp.issuer, subject: 'sub-ines' },
      );
      assert.equal((await server.sql('users').where({ oidc_subject: 'sub-ines' })).length, 1);
    });

    it("creates one user when the same person's first two sign-ins race", async () => {
      const since = await head();
      const ready = await Promise.all([reachCallback('sub-ravi'), reachCallback('sub-ravi')]);
      const answers = await Promise.allSettled(
        ready.map((r) => r.web.get(r.callback.pathname + r.callback.search)),
      );
      assert.deepEqual(
        answers.map((a) => a.status === 'fulfilled' && a.value.res.status),
        [200, 200],
      );
      const rows = await rowsSince(since, ['user.created', 'user.login']);
      assert.deepEqual(rows.map((r) => r.kind).sort(), ['user.created', 'user.login', 'user.login']);
      assert.equal((await server.sql('users').where({ oidc_subject: 'sub-ravi' })).length, 1);
    });

    it('maps roles from the groups claim: compliance reaches /audit, a chair does not', async () => {
      const ines = await signIn('sub-ines');
      assert.equal((await ines.web.get('/audit')).res.status, 200);
      const rosa = await signIn('sub-rosa');
      assert.equal(rosa.done.res.headers.get('refresh'), '0; url=/approvals');
      const queue = await rosa.web.get('/approvals');
      assert.equal(queue.res.status, 200);
      assert.match(queue.html, /rosa <small>\(chair\)<\/small>/);
      assert.equal((await rosa.web.get('/audit')).res.status, 403);
    });

    it('names a person without preferred_username by their e-mail address, recorded only when verified', async () => {
      assert.equal((await signIn('sub-gil')).done.res.status, 200);
      const gil = (await userRow('gil@example.com')) as Record<string, unknown>;
      assert.deepEqual([gil.email, rolesOf(gil.roles)], ['gil@example.com', ['chair', 'compliance']]);
      assert.equal((await signIn('sub-vera')).done.res.status, 200);
      const vera = (await userRow('vera@example.com')) as Record<string, unknown>;
      assert.equal(vera.email, null, 'the provider says the address is not verified');
      assert.equal((await signIn('sub-kim')).done.res.status, 200);
      const kim = (await userRow('kim@example.com')) as Record<string, unknown>;
      assert.equal(kim.email, null, 'the provider does not say the address is verified');
    });

    it('brings roles in line with the claims at each sign-in, as user.role_changed by the provider', async () => {
      await signIn('sub-lena');
      const since = await head();
      idp.accounts.set('sub-lena', { ...PEOPLE['sub-lena'], groups: ['cs-audit', 'cs-chairs'] });
      const run = await signIn('sub-lena');
      assert.equal(run.done.res.status, 200);
      assert.equal((await run.web.get('/audit')).res.status, 200, 'the new role applies at once');
      const [changed, ...rest] = await rowsSince(since, ['user.role_changed', 'user.created']);
      assert.equal(rest.length, 0);
      assert.equal(changed!.actor, `oidc:${idp.issuer}`);
      assert.deepEqual(
        [
          changed!.details.user,
          changed!.details.roles_before,
          changed!.details.roles_after,
          changed!.details.via,
        ],
        ['lena', ['chair'], ['chair', 'compliance'], 'oidc'],
      );
    });

    it('refuses a person whose claims grant no role (403), audited, and creates no user', async () => {
      const since = await head();
      const run = await signIn('sub-noah');
      const row = await assertRefused(run, since, 403, 'no_role');
      assert.match(run.done.html, /grants no role here/);
      assert.equal(row.actor, 'noah');
      assert.equal(row.details.subject, 'sub-noah');
      assert.equal(await userRow('noah'), undefined);
    });

    it('ends the sessions of a person whose role the provider withdrew, and refuses them', async () => {
      const first = await signIn('sub-dora');
      assert.equal((await first.web.get('/approvals')).res.status, 200);
      const since = await head();
      idp.accounts.set('sub-dora', { ...PEOPLE['sub-dora'], groups: ['staff'] });
      await assertRefused(await signIn('sub-dora'), since, 403, 'no_role');
      assert.equal((await first.web.get('/approvals')).res.status, 303, 'the earlier session is over');
    });

    it('refuses a disabled user', async () => {
      await signIn('sub-tess');
      await server.sql('users').where({ name: 'tess' }).update({ disabled_at: new Date().toISOString() });
      const since = await head();
      const row = await assertRefused(await signIn('sub-tess'), since, 403, 'disabled');
      assert.equal(row.actor, 'tess');
    });

    it('never takes over a local account of the same name, and an SSO user has no password', async () => {
      await createUser(server.sql, {
        name: 'cora',
        roles: ['admin'],
        password: 'cora local password',
      });
      const since = await head();
      const run = await signIn('sub-cora');
      await assertRefused(run, since, 403, 'name_taken');
      const local = (await userRow('cora')) as Record<string, unknown>;
      assert.deepEqual([local.oidc_subject, rolesOf(local.roles)], [null, ['admin']]);

      const knex = server.sql;
      assert.equal(await checkCredentials(knex, 'ines', ''), undefined);
      const form = await new WebClient(server.url).login('ines', 'anything at all');
      assert.equal(form.res.status, 401, 'no password opens an SSO account');
      await assert.rejects(
        knex.transaction((trx) => changeUser(trx, 'ines', { password: 'a password of her own' })),
        (err: unknown) => isAppError(err, 'CONFLICT', 'oidc_user'),
        'nor can one be set for it',
      );
      assert.equal(((await userRow('ines')) as { password_hash: string | null }).password_hash, null);
    });

    it('refuses an answer whose state was forged (400), without redeeming its code', async () => {
      const since = await head();
      const run = await signIn('sub-rosa', {
        forge: (url) => url.searchParams.set('state', 'forged-state-of-another-attempt'),
      });
      await assertRefused(run, since, 400, 'state_mismatch');
      // The code was not spent: the genuine answer, with its attempt cookie, still signs in.
      const honest = new WebClient(server.url);
      honest.cookies.set('cs_oidc', run.attemptCookie.split(';')[0]!.slice('cs_oidc='.length));
      const url = new URL(run.callback);
      url.searchParams.set(
        'state',
        new URL(run.start.res.headers.get('location')!).searchParams.get('state')!,
      );
      assert.equal((await honest.get(url.pathname + url.search)).res.status, 200);
    });

    it("refuses an ID token whose nonce is not this attempt's (400)", async () => {
      const since = await head();
      const run = await signIn('sub-rosa', {
        alter: (url) => url.searchParams.set('nonce', 'a-nonce-this-browser-never-made-0123456789'),
      });
      await assertRefused(run, since, 400, 'nonce_mismatch');
    });

    it('refuses an answer naming another issuer in its iss parameter (RFC 9207)', async () => {
      const since = await head();
      const run = await signIn('sub-rosa', {
        forge: (url) => url.searchParams.set('iss', 'https://evil.example'),
      });
      await assertRefused(run, since, 403, 'issuer_mismatch');
    });

    it('refuses an error the provider returned (access_denied), with its code recorded', async () => {
      const since = await head();
      const run = await signIn(undefined);
      assert.equal(run.callback.searchParams.get('error'), 'access_denied');
      const row = await assertRefused(run, since, 403, 'provider_error');
      assert.equal(row.details.error, 'access_denied');
    });

    it('refuses a callback without its attempt (another browser, or replayed after use)', async () => {
      const run = await signIn('sub-rosa');
      assert.equal(run.done.res.status, 200);
      const since = await head();
      const replay = await run.web.get(run.callback.pathname + run.callback.search);
      assert.equal(replay.res.status, 400);
      assert.match(replay.html, /reason: no_attempt/);
      const stranger = await new WebClient(server.url).get(run.callback.pathname + run.callback.search);
      assert.equal(stranger.res.status, 400);
      const rows = await rowsSince(since, ['user.login', 'user.login_failed']);
      assert.deepEqual(
        rows.map((r) => [r.kind, r.details.reason]),
        [
          ['user.login_failed', 'no_attempt'],
          ['user.login_failed', 'no_attempt'],
        ],
      );
    });

    it(
      'a chair signs in through Chromium and reaches /approvals with the chair role',
      {
        skip: withoutChromium,
      },
      async () => {
        const browser: Browser = await launchChromium();
        try {
          const page = await browser.newPage();
          await page.goto(`${server.url}/approvals`);
          await page.waitForURL('**/login?next=%2Fapprovals');
          idp.signInAs('sub-rosa');
          await page.getByRole('link', { name: 'Sign in with Example ID', exact: true }).click();
          await page.waitForURL(`${server.url}/approvals`);
          assert.match(await page.locator('header nav').innerText(), /rosa \(chair\)/);
          assert.match(await page.locator('h1').innerText(), /Approval requests/);
        } finally {
          await browser.close();
        }
      },
    );
  });

  describe(`single sign-on with a provider that answers for another issuer on ${kind}`, () => {
    let idp: OpenIdProvider;
    let impostor: Server;
    let server: TestServer;
    let issuer: string;

    before(async () => {
      const port = await freePort();
      idp = await startOpenIdProvider({ redirectUris: [`http://127.0.0.1:${port}${CALLBACK}`] });
      // Issuer A serves issuer B's discovery document, as a look-alike would.
      impostor = createServer((req, res) => {
        void fetch(new URL(req.url!, idp.issuer)).then(async (answer) => {
          res.writeHead(answer.status, { 'content-type': 'application/json' });
          res.end(await answer.text());
        });
      });
      await new Promise<void>((resolve) => impostor.listen(0, '127.0.0.1', resolve));
      issuer = `http://127.0.0.1:${(impostor.address() as AddressInfo).port}`;
      server = await startTestServer(kind, oidcEnv(issuer, port));
    });
    after(async () => {
      await server?.stop();
      await new Promise<void>((resolve) => (impostor ? impostor.close(() => resolve()) : resolve()));
      await idp?.close();
    });

    it('refuses to start a sign-in (403) and audits the issuer mismatch', async () => {
      const web = new WebClient(server.url);
      const res = await web.get('/login/oidc');
      assert.equal(res.res.status, 403);
      assert.match(res.html, /not the one this server trusts/);
      assert.equal(web.cookies.has('cs_oidc'), false);
      const rows = (await server.sql('audit_events').where({ kind: 'user.login_failed' })) as {
        details: unknown;
      }[];
      const details = rows.map((r) => (typeof r.details === 'string' ? JSON.parse(r.details) : r.details));
      assert.deepEqual(
        details.map((d: Record<string, unknown>) => [d.via, d.issuer, d.reason]),
        [['oidc', issuer, 'issuer_mismatch']],
      );
    });
  });

  describe(`single sign-on with a provider whose keys do not match, then gone, on ${kind}`, () => {
    let idp: OpenIdProvider;
    let server: TestServer;

    before(async () => {
      const port = await freePort();
      idp = await startOpenIdProvider({ redirectUris: [`http://127.0.0.1:${port}${CALLBACK}`] });
      idp.accounts.set('sub-rosa', PEOPLE['sub-rosa']);
      idp.decoyKeys = true;
      server = await startTestServer(kind, oidcEnv(idp.issuer, port));
    });
    after(async () => {
      await server?.stop();
      await idp?.close();
    });

    it("refuses an ID token whose signature does not verify with the provider's published keys", async () => {
      const since = await auditHead(server);
      const run = await signInAt(server, idp, 'sub-rosa');
      assert.equal(run.done.res.status, 400);
      assert.match(run.done.html, /reason: invalid_response/);
      assert.equal(run.web.cookies.has('cs_session'), false);
      const rows = await auditRowsSince(server, since, ['user.login', 'user.login_failed', 'user.created']);
      assert.deepEqual(
        rows.map((r) => [r.kind, r.details.reason]),
        [['user.login_failed', 'invalid_response']],
      );
      assert.equal(rows[0]!.details.error, 'JWT signature verification failed');
      assert.equal(await server.sql('users').where({ name: 'rosa' }).first(), undefined);
    });

    it('answers 503 with Retry-After when the provider cannot be reached to redeem the code', async () => {
      idp.decoyKeys = false;
      const reached = await reachCallbackAt(server, idp, 'sub-rosa');
      await idp.close();
      const since = await auditHead(server);
      const done = await reached.web.get(reached.callback.pathname + reached.callback.search);
      assert.equal(done.res.status, 503);
      assert.equal(done.res.headers.get('retry-after'), '30');
      assert.match(done.html, /reason: provider_unavailable/);
      const rows = await auditRowsSince(server, since, ['user.login_failed']);
      assert.deepEqual(
        rows.map((r) => r.details.reason),
        ['provider_unavailable'],
      );
    });
  });
}

describe('single sign-on configuration', () => {
  const env = {
    COUNTERSIGN_OIDC_ISSUER: 'https://login.example.com/realms/staff',
    COUNTERSIGN_OIDC_CLIENT_ID: 'countersign',
    COUNTERSIGN_OIDC_CLIENT_SECRET: 'client-secret-from-the-provider',
    COUNTERSIGN_OIDC_ROLES: '/countersign-chairs=chair,/countersign-admins=chair+admin',
  };

  it('has defaults for all but the issuer, the client and the role map', () => {
    const { oidc } = loadConfig(env, '/').web;
    assert.deepEqual(oidc, {
      issuer: 'https://login.example.com/realms/staff',
      client_id: 'countersign',
      client_secret: 'client-secret-from-the-provider',
      token_endpoint_auth_method: 'client_secret_basic',
      redirect_path: '/login/oidc/callback',
      scopes: ['openid', 'email', 'profile'],
      label: 'single sign-on',
      username_claims: ['preferred_username', 'email'],
      role_claim: 'groups',
      roles: { '/countersign-chairs': ['chair'], '/countersign-admins': ['chair', 'admin'] },
    });
    assert.ok(Object.isFrozen(oidc) && Object.isFrozen(oidc!.roles));
  });

  it('refuses a section that cannot work, naming the key', () => {
    const cases: [Record<string, string>, RegExp][] = [
      [{ COUNTERSIGN_OIDC_ROLES: '' }, /"web\.oidc\.roles"/],
      [
        { COUNTERSIGN_OIDC_ROLES: 'staff=owner' },
        /"web\.oidc\.roles\.staff\.0": Invalid option: expected one of/,
      ],
      [{ COUNTERSIGN_OIDC_ROLES: 'staff' }, /COUNTERSIGN_OIDC_ROLES: expected value=role\+role pairs/],
      [{ COUNTERSIGN_OIDC_ISSUER: 'http://login.example.com' }, /"web\.oidc\.issuer".*https:\/\//],
      [{ COUNTERSIGN_OIDC_SCOPES: 'email,profile' }, /"web\.oidc\.scopes".*"openid"/],
      [{ COUNTERSIGN_OIDC_REDIRECT_PATH: '/login' }, /"web\.oidc\.redirect_path"/],
      [{ COUNTERSIGN_OIDC_CLIENT_SECRET: '' }, /"web\.oidc\.client_secret"/],
      [{ COUNTERSIGN_PORT: '0' }, /"http\.public_url".*redirect URI/],
    ];
    for (const [change, message] of cases) {
      assert.throws(
        () => loadConfig({ ...env, ...change }, '/'),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID', 'config') && message.test(err.message),
        JSON.stringify(change),
      );
    }
  });

  it('keeps the client secret out of the configuration digest', () => {
    const config = loadConfig(env, '/');
    const redacted = JSON.stringify(redactedConfig(config));
    assert.ok(!redacted.includes('client-secret-from-the-provider'));
    assert.match(redacted, /"client_secret":"\[redacted\]"/);
    const other = loadConfig({ ...env, COUNTERSIGN_OIDC_CLIENT_SECRET: 'another-secret' }, '/');
    assert.equal(configDigest(other), configDigest(config), 'a new secret alone changes no digest');
  });
});

describe('single sign-on claim mapping', () => {
  const config = OidcSchema.parse({
    issuer: 'https://sso.example.com/realms/staff',
    client_id: 'countersign',
    client_secret: 'secret',
    role_claim: 'realm_access.roles',
    roles: { approver: ['chair'], auditor: ['compliance'], operator: ['admin', 'chair'] },
  });

  it('reads a dotted role claim as a path, joins the roles of every value, and keeps their order', () => {
    const identity = identityOf(config, {
      sub: 'f3a1',
      preferred_username: 'Ada Lovelace',
      email: 'ada@example.com',
      realm_access: { roles: ['offline_access', 'operator', 'auditor'] },
    });
    assert.deepEqual(identity, {
      issuer: config.issuer,
      subject: 'f3a1',
      name: 'ada@example.com',
      roles: ['chair', 'compliance', 'admin'],
      // No email_verified: the address is claimed, not verified.
      email: undefined,
      claimed_email: 'ada@example.com',
    });
    const verified = identityOf(config, { sub: 'f3a1', email: 'ada@example.com', email_verified: true });
    assert.deepEqual([verified.email, verified.claimed_email], ['ada@example.com', 'ada@example.com']);
    for (const email_verified of [false, 'true', 1]) {
      const unsure = identityOf(config, { sub: 'f3a1', email: 'ada@example.com', email_verified });
      assert.equal(unsure.email, undefined, `email_verified: ${JSON.stringify(email_verified)}`);
    }
  });

  it('prefers a claim named with dots over the path, takes a single string, and maps nothing else', () => {
    const byName = identityOf(config, { sub: 's', 'realm_access.roles': 'approver' });
    assert.deepEqual([byName.roles, byName.name], [['chair'], undefined]);
    for (const odd of [{ roles: [7, null] }, { roles: 'nobody' }, 'approver', null]) {
      assert.deepEqual(identityOf(config, { sub: 's', realm_access: odd }).roles, []);
    }
    assert.deepEqual(identityOf(config, { sub: 's', realm_access: { roles: ['__proto__'] } }).roles, []);
  });
});
