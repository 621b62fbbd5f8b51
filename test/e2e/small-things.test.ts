import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import pino from 'pino';
import type { Notice } from '../../src/approval/outbox.ts';
import { startHttpServer, type RunningServer } from '../../src/app/serve-http.ts';
import { loadConfig } from '../../src/config.ts';
import { sendWebhook, webhookBody } from '../../src/notify/webhook.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { startOpenIdProvider, freePort, type OpenIdProvider } from '../helpers/openid-provider.ts';
import { CALLBACK, oidcEnv, signInAt } from '../helpers/oidc-flow.ts';
import { ROOT, startTestServer, testEnv, type TestServer } from '../helpers/server.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { createUser } from '../../src/accounts/users.ts';

for (const kind of databaseKinds()) {
  describe(`the web pages' small edges (${kind})`, () => {
    let db: TestDatabase;
    let server: RunningServer;
    const logged: string[] = [];

    before(async () => {
      db = await createTestDatabase(kind);
      const config = loadConfig(testEnv(db), db.dataDir);
      const sink = new Writable({
        write(chunk: Buffer, _enc, done) {
          logged.push(chunk.toString());
          done();
        },
      });
      server = await startHttpServer(config, pino({ level: 'info' }, sink), {});
    });
    after(async () => {
      await server.close();
      await db.drop();
    });

    it('refuses an Origin on another port or scheme of the same host', async () => {
      const own = new URL(server.url);
      const get = (origin: string) => fetch(new URL('/login', server.url), { headers: { origin } });
      assert.equal((await get(own.origin)).status, 200);
      for (const other of [
        `http://${own.hostname}:${Number(own.port) + 1}`,
        `https://${own.host}`,
        `http://${own.hostname}`,
      ]) {
        const res = await get(other);
        assert.equal(res.status, 403, other);
        const problem = (await res.json()) as { code: string; reason: string };
        assert.deepEqual([problem.code, problem.reason], ['PERMISSION_DENIED', 'origin_not_allowed']);
      }
    });

    it('refuses an Origin of another host, on the same port or another', async () => {
      const own = new URL(server.url);
      for (const other of [`http://evil.example:${own.port}`, 'http://evil.example', 'null']) {
        const res = await fetch(new URL('/login', server.url), { headers: { origin: other } });
        assert.equal(res.status, 403, other);
        const problem = (await res.json()) as { reason: string };
        assert.equal(problem.reason, 'origin_not_allowed');
      }
    });

    it('answers a missing /static file 404, logging nothing of the path', async () => {
      logged.length = 0;
      for (const missing of ['/static/nope.css', '/static/deeper/nope.js', '/static/.hidden']) {
        const res = await fetch(new URL(missing, server.url));
        assert.equal(res.status, 404, missing);
        const problem = (await res.json()) as { code: string };
        assert.equal(problem.code, 'NOT_FOUND');
      }
      const present = await fetch(new URL('/static/time.js', server.url));
      assert.equal(present.status, 200);
      await present.body?.cancel();
      assert.equal(logged.filter((l) => l.includes(ROOT) || l.includes('"level":50')).length, 0);
    });
  });

  describe(`a sign-in's next with characters beyond Latin-1 (${kind})`, () => {
    let idp: OpenIdProvider;
    let server: TestServer;
    before(async () => {
      const port = await freePort();
      idp = await startOpenIdProvider({ redirectUris: [`http://127.0.0.1:${port}${CALLBACK}`] });
      idp.accounts.set('sub-zoe', { preferred_username: 'zoe', groups: ['cs-chairs'] });
      server = await startTestServer(kind, oidcEnv(idp.issuer, port));
    });
    after(async () => {
      await server?.stop();
      await idp?.close();
    });

    it('is percent-encoded by a password sign-in too, which answers 303 with the session cookie', async () => {
      await createUser(server.sql, { name: 'yan', roles: ['chair'], password: 'yan password' });
      const web = new WebClient(server.url);
      const page = await web.get(`/login?next=${encodeURIComponent('/audit?q=Zoë ✓')}`);
      const signedIn = await web.post('/login', {
        _csrf: WebClient.field(page.html, '_csrf'),
        next: WebClient.field(page.html, 'next'),
        name: 'yan',
        password: 'yan password',
      });
      assert.equal(signedIn.res.status, 303, signedIn.html);
      assert.equal(signedIn.res.headers.get('location'), '/audit?q=Zo%C3%AB%20%E2%9C%93');
      assert.ok(web.cookies.has('cs_session'));
    });

    it('is percent-encoded, so the sign-in that set the session cookie completes', async () => {
      const run = await signInAt(server, idp, 'sub-zoe', { next: '/audit?q=Zoë ✓' });
      assert.equal(run.done.res.status, 200, run.done.html);
      assert.equal(run.done.res.headers.get('refresh'), '0; url=/audit?q=Zo%C3%AB%20%E2%9C%93');
      assert.ok(run.web.cookies.has('cs_session'));
    });
  });
}

const NOTICE: Notice = {
  event: 'requested',
  approval_request_id: 'apr_1',
  agent_id: 'agt_1',
  agent: 'bot <!here>',
  tool: 'send_message',
  target: { target_type: 'user', target_id: 'u1', display_name: 'Tom & <!channel>' },
  source: 'local',
  content_sha256: 'ab'.repeat(32),
  file_sha256: null,
  excerpt: 'hi',
  excerpt_truncated: false,
  content_text: 'urgent <!channel> see <https://evil.example/|https://bank.example/> & pay',
  file: { name: '<https://evil.example/|invoice.pdf>', size_bytes: 3 },
  status: 'pending',
  review_url: 'http://127.0.0.1:8787/approvals/apr_1?a=1&b=2',
  expires_at: '2026-12-31T00:00:00.000Z',
  approvers: [],
  decided_by: null,
  note: null,
};

/** The paths by which `target` can be reached from `root` through own enumerable properties. */
function pathsTo(target: unknown, root: object, at = 'services', seen = new Set<unknown>()): string[] {
  if (root === target) return [at];
  if (seen.has(root)) return [];
  seen.add(root);
  return Object.entries(root).flatMap(([key, value]) =>
    value !== null && (typeof value === 'object' || typeof value === 'function')
      ? pathsTo(target, value as object, `${at}.${key}`, seen)
      : [],
  );
}

describe('the services the transports get', () => {
  it('carry no handle on the database', async () => {
    const server = await startTestServer('pglite');
    try {
      assert.deepEqual(pathsTo(server.sql, server.services), []);
    } finally {
      await server.stop();
    }
  });
});

describe('webhook notices', () => {
  it('escape &, < and > in the text, so content can neither mention nor disguise a link', () => {
    const { text, target } = JSON.parse(webhookBody(NOTICE)) as { text: string; target: Notice['target'] };
    assert.doesNotMatch(text, /<!|<https?:/);
    assert.match(text, /&lt;!channel&gt;/);
    assert.match(text, /&lt;!here&gt;/);
    assert.match(text, /&lt;https:\/\/evil\.example\/\|https:\/\/bank\.example\/&gt; &amp; pay/);
    assert.match(text, /Tom &amp; &lt;!channel&gt;/);
    // The structured fields stay as they are: only the text is Slack's.
    assert.equal(target.display_name, 'Tom & <!channel>');
    const decided = JSON.parse(
      webhookBody({
        ...NOTICE,
        event: 'decided',
        status: 'rejected',
        decided_by: 'ada',
        note: '<!everyone>',
      }),
    ) as { text: string };
    assert.match(decided.text, /Note: &lt;!everyone&gt;/);
  });

  it('do not follow a redirect: it is a failed delivery', async () => {
    let landed = 0;
    const http: Server = createServer((req, res) => {
      if (req.url === '/hook') res.writeHead(307, { location: '/landing' }).end();
      else {
        landed++;
        res.writeHead(200).end();
      }
    });
    await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/hook`;
      await assert.rejects(sendWebhook({ url, secret: 's', timeoutMs: 5000 }, NOTICE), /HTTP 307/);
      assert.equal(landed, 0);
    } finally {
      await new Promise((resolve) => http.close(resolve));
    }
  });
});

describe("the embedded database's files", () => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-modes-'));
  const pgliteDir = path.join(dataDir, 'pglite');
  before(() => {
    // Another process, under the most permissive umask, creates and writes the database.
    const script = `
      process.umask(0);
      const { openDatabase } = await import(${JSON.stringify(path.join(ROOT, 'src/db/knex.ts'))});
      const db = await openDatabase({ pgliteDir: ${JSON.stringify(pgliteDir)}, command: 'test' });
      await db.knex.raw('create table t (x int)');
      await db.knex.raw('insert into t values (1)');
      await db.close();`;
    const child = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: ROOT,
      encoding: 'utf8',
    });
    assert.equal(child.status, 0, child.stderr);
  });
  after(() => fs.rmSync(dataDir, { recursive: true, force: true }));

  it('are 0600 and its directories 0700 whatever the umask', () => {
    const wrong: string[] = [];
    const walk = (at: string) => {
      const mode = fs.statSync(at).mode & 0o777;
      if (mode !== 0o700) wrong.push(`${at} ${mode.toString(8)}`);
      for (const entry of fs.readdirSync(at, { withFileTypes: true })) {
        const full = path.join(at, entry.name);
        if (entry.isDirectory()) walk(full);
        else if ((fs.statSync(full).mode & 0o777) !== 0o600)
          wrong.push(`${full} ${(fs.statSync(full).mode & 0o777).toString(8)}`);
      }
    };
    walk(pgliteDir);
    assert.deepEqual(wrong.slice(0, 5), []);
  });

  // Running a command as another user (nobody) takes root; CI runs as root, so there it always runs.
  const asRoot = process.getuid?.() === 0;
  it(
    'are closed to another user: the files cannot be read, the directories not listed',
    { skip: !asRoot && process.env.CI !== 'true' && 'needs root, to run commands as the user nobody' },
    () => {
      assert.ok(asRoot, 'under CI=true this runs as root');
      fs.chmodSync(dataDir, 0o755);
      const asNobody = (...cmd: string[]) =>
        spawnSync('runuser', ['-u', 'nobody', '--', ...cmd], { encoding: 'utf8' }).status;
      // The same command on a file nobody may read succeeds: runuser itself works here.
      assert.equal(asNobody('ls', dataDir), 0);
      assert.notEqual(asNobody('cat', path.join(pgliteDir, 'PG_VERSION')), 0);
      assert.notEqual(asNobody('ls', pgliteDir), 0);
      assert.notEqual(asNobody('ls', path.join(pgliteDir, 'base')), 0);
    },
  );
});
