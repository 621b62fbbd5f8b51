import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createUser } from '../../src/accounts/users.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { CALLBACK, oidcEnv } from '../helpers/oidc-flow.ts';
import { freePort, startOpenIdProvider, type OpenIdProvider } from '../helpers/openid-provider.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';

/** A login form's token and cookie, fetched once and reused by many posts (as a burst from one page would). */
async function loginForm(base: string) {
  const web = new WebClient(base);
  const page = await web.get('/login');
  const csrf = WebClient.field(page.html, '_csrf');
  const cookie = [...web.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
  return (name: string, password: string, at = base) =>
    fetch(new URL('/login', at), {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded', cookie },
      body: new URLSearchParams({ _csrf: csrf, next: '/approvals', name, password }).toString(),
    }).then(async (res) => ({ status: res.status, retryAfter: res.headers.get('retry-after') }));
}

const failedRows = async (server: TestServer, actor?: string) =>
  (await server
    .sql('audit_events')
    .where({ kind: 'user.login_failed' })
    .modify((q) => (actor ? q.where({ actor }) : q))
    .select('details')) as { details: unknown }[];

const statuses = (answers: { status: number }[]) =>
  answers.reduce<Record<number, number>>((n, a) => ({ ...n, [a.status]: (n[a.status] ?? 0) + 1 }), {});

for (const kind of databaseKinds()) {
  describe(`password sign-in limits under concurrency on ${kind}`, () => {
    let server: TestServer;

    before(async () => {
      // A wide per-address limit here: these cases are about the per-user one.
      server = await startTestServer(kind, { COUNTERSIGN_LOGIN_FAILURES_PER_IP: '1000' });
      for (const name of ['ada', 'bea', 'cy', 'dee', 'lena']) {
        await createUser(server.sql, { name, roles: ['chair'], password: `${name} password` });
      }
    });
    after(async () => {
      await server?.stop();
    });

    it('checks at most 5 of 59 simultaneous wrong passwords, then refuses the right one', async () => {
      const post = await loginForm(server.url);
      const answers = await Promise.all(Array.from({ length: 59 }, (_, i) => post('ada', `wrong ${i}`)));
      assert.deepEqual(statuses(answers), { 401: 5, 429: 54 });
      assert.equal((await failedRows(server, 'ada')).length, 5, 'exactly the checked ones are audited');
      for (const refused of answers.filter((a) => a.status === 429)) assert.equal(refused.retryAfter, '900');
      const right = await post('ada', 'ada password');
      assert.equal(right.status, 429, 'the limit was reached: the right password is not even checked');
    });

    it('lets no more than 5 of 60 simultaneous tries, right one among them, be checked', async () => {
      const post = await loginForm(server.url);
      const tries = Array.from({ length: 60 }, (_, i) => (i === 30 ? 'bea password' : `wrong ${i}`));
      const answers = await Promise.all(tries.map((password) => post('bea', password)));
      const counts = statuses(answers);
      const checked = (counts[401] ?? 0) + (counts[303] ?? 0);
      assert.ok(checked <= 5, `at most 5 checked, saw ${JSON.stringify(counts)}`);
      assert.equal(counts[429], 60 - checked);
      assert.equal((await failedRows(server, 'bea')).length, counts[401] ?? 0);
      const rightAnswer = answers[30]!.status;
      assert.ok(rightAnswer === 429 || rightAnswer === 303, `the right one: ${rightAnswer}`);
    });

    it('forgets failures older than 15 minutes, and a success does not count', async () => {
      const knex = server.sql;
      const old = new Date(Date.now() - 16 * 60 * 1000).toISOString();
      await knex('sign_in_attempts').insert(
        Array.from({ length: 5 }, () => ({ bucket: 'password', name: 'dee', origin: '127.0.0.1', at: old })),
      );
      const post = await loginForm(server.url);
      for (let i = 0; i < 3; i++) assert.equal((await post('dee', 'dee password')).status, 303);
      assert.equal((await knex('sign_in_attempts').where({ name: 'dee' })).length, 0, 'expired rows purged');
      for (let i = 0; i < 5; i++) assert.equal((await post('dee', `wrong ${i}`)).status, 401);
      assert.equal((await post('dee', 'dee password')).status, 429);
    });

    it('holds the per-user limit for simultaneous --as sign-ins on the command line', async () => {
      const list = (password: string) =>
        runCli(['approvals', 'list', '--as', 'lena'], { ...server.env, COUNTERSIGN_PASSWORD: password });
      const runs = await Promise.all(Array.from({ length: 8 }, (_, i) => list(`wrong ${i}`)));
      assert.ok(runs.every((r) => r.code === 1));
      const wrong = runs.filter((r) => /wrong user name or password/.test(r.stderr)).length;
      const locked = runs.filter((r) => /too many failed sign-ins/.test(r.stderr)).length;
      assert.deepEqual({ wrong, locked }, { wrong: 5, locked: 3 });
      assert.equal((await failedRows(server, 'lena')).length, 5);
      const right = await list('lena password');
      assert.match(right.stderr, /too many failed sign-ins/);
    });

    // Two processes share one database only on PostgreSQL (a PGlite directory has one holder).
    if (kind === 'postgres')
      it('holds the per-user limit across two server processes on one database', async () => {
        const replicas = await Promise.all([spawnServer(server.env), spawnServer(server.env)]);
        try {
          const posts = await Promise.all(replicas.map((r) => loginForm(r.url)));
          const answers = await Promise.all(
            Array.from({ length: 40 }, (_, i) => posts[i % 2]!('cy', `wrong ${i}`)),
          );
          assert.deepEqual(statuses(answers), { 401: 5, 429: 35 });
          assert.equal((await failedRows(server, 'cy')).length, 5);
        } finally {
          await Promise.allSettled(replicas.map((r) => stopChild(r.child)));
        }
      });
  });

  describe(`single sign-on refusals and the password limits on ${kind}`, () => {
    let idp: OpenIdProvider;
    let server: TestServer;

    before(async () => {
      const port = await freePort();
      idp = await startOpenIdProvider({
        redirectUris: [`http://127.0.0.1:${port}${CALLBACK}`],
        host: 'localhost',
      });
      // Every refusal's own row kept: these cases are about the limit, not the flood (refusal-summary.test.ts).
      server = await startTestServer(kind, {
        ...oidcEnv(idp.issuer, port),
        COUNTERSIGN_DENIED_ROWS_PER_MINUTE: '100',
      });
      await createUser(server.sql, { name: 'ines', roles: ['chair'], password: 'ines password' });
    });
    after(async () => {
      await server?.stop();
      await idp?.close();
    });

    const bogusCallback = () =>
      fetch(new URL(`${CALLBACK}?code=x&state=y`, server.url), { redirect: 'manual' }).then(async (res) => ({
        status: res.status,
        retryAfter: res.headers.get('retry-after'),
        html: await res.text(),
      }));

    it('never lets forged callbacks lock out a password, and limits them on their own', async () => {
      const forged = await Promise.all(Array.from({ length: 20 }, bogusCallback));
      assert.deepEqual(statuses(forged), { 400: 20 });
      const oidcRows = (await failedRows(server)).map((r) =>
        typeof r.details === 'string' ? JSON.parse(r.details) : r.details,
      ) as { via: string; reason: string }[];
      assert.equal(oidcRows.filter((d) => d.via === 'oidc' && d.reason === 'no_attempt').length, 20);

      const web = new WebClient(server.url);
      const signedIn = await web.login('ines', 'ines password');
      assert.equal(signedIn.res.status, 303, 'the password still signs in from that address');
      assert.equal(signedIn.res.headers.get('location'), '/approvals');

      const beyond = await bogusCallback();
      assert.equal(beyond.status, 429);
      assert.equal(beyond.retryAfter, '900');
      assert.match(beyond.html, /reason: too_many_attempts/);
      const reasons = (await failedRows(server)).map(
        (r) => (typeof r.details === 'string' ? JSON.parse(r.details) : r.details) as { reason?: string },
      );
      assert.equal(
        reasons.filter((d) => d.reason === 'no_attempt').length,
        20,
        'none checked past the limit',
      );
      assert.equal(
        reasons.filter((d) => d.reason === 'too_many_attempts').length,
        1,
        'the refusal is counted',
      );
    });

    it('holds the per-address limit for simultaneous wrong passwords under many names', async () => {
      const post = await loginForm(server.url);
      const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => post(`nobody-${i}`, 'wrong')));
      assert.deepEqual(statuses(answers), { 401: 20, 429: 20 });
    });
  });

  // Two processes share one database only on PostgreSQL; a server of its own, so that the address has
  // all of its attempts left.
  if (kind === 'postgres')
    describe('the per-address limit across two server processes on postgres', () => {
      let server: TestServer;
      before(async () => {
        server = await startTestServer(kind);
      });
      after(async () => {
        await server?.stop();
      });

      it('checks at most 20 of 40 simultaneous wrong passwords under many names, split over two replicas', async () => {
        const replicas = await Promise.all([spawnServer(server.env), spawnServer(server.env)]);
        try {
          const posts = await Promise.all(replicas.map((r) => loginForm(r.url)));
          const answers = await Promise.all(
            Array.from({ length: 40 }, (_, i) => posts[i % 2]!(`someone-${i}`, 'wrong')),
          );
          assert.deepEqual(statuses(answers), { 401: 20, 429: 20 });
          assert.equal((await failedRows(server)).length, 20);
        } finally {
          await Promise.allSettled(replicas.map((r) => stopChild(r.child)));
        }
      });
    });
}
