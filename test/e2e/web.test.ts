import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { importData } from '../../src/connectors/local/import.ts';
import { createAgent } from '../../src/accounts/agents.ts';
import type { User } from '../../src/core/identity.ts';
import { createUser } from '../../src/accounts/users.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

const XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>';

for (const kind of databaseKinds()) {
  describe(`the chair's web pages on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let hook: http.Server;
    const notices: { body: string; headers: http.IncomingHttpHeaders }[] = [];
    const draft = async (content_text: string, target_id = 'ct_david') =>
      (await call(agent, 'isphere_send_message', { target_type: 'contact', target_id, content_text }))
        .approval.approval_request_id as string;

    before(async () => {
      hook = http.createServer((req, res) => {
        let body = '';
        req.on('data', (c: Buffer) => (body += c.toString()));
        req.on('end', () => {
          notices.push({ body, headers: req.headers });
          res.end('ok');
        });
      });
      await new Promise<void>((r) => hook.listen(0, '127.0.0.1', () => r()));
      server = await startTestServer(kind, {
        COUNTERSIGN_WEBHOOK_URL: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/hook`,
        COUNTERSIGN_WEBHOOK_SECRET: 'a-webhook-secret-of-some-length',
        COUNTERSIGN_LOGIN_FAILURES_PER_USER: '3',
      });
      const knex = server.sql;
      await createUser(knex, { name: 'ada', roles: ['chair'], password: 'ada password' });
      await createUser(knex, { name: 'carl', roles: ['compliance', 'admin'], password: 'carl password' });
      await createUser(knex, { name: 'olga', roles: ['chair'], password: 'olga password' });
      await createUser(knex, { name: 'locked', roles: ['chair'], password: 'locked password' });
      await createAgent(knex, { name: 'olgas-bot', owner: 'olga' });
      await importData(knex, server.services.blobs, { contacts: [{ id: 'ct_evil', display_name: XSS }] });
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
      hook?.close();
    });

    it('sends an unauthenticated visitor to the login page, keeping where they were going', async () => {
      const web = new WebClient(server.url);
      const id = await draft('where was I');
      const res = await web.get(`/approvals/${id}`);
      assert.equal(res.res.status, 303);
      assert.equal(res.res.headers.get('location'), `/login?next=${encodeURIComponent(`/approvals/${id}`)}`);
      const login = await web.get(res.res.headers.get('location')!);
      assert.equal(WebClient.field(login.html, 'next'), `/approvals/${id}`);
      const post = await web.post('/login', {
        _csrf: WebClient.field(login.html, '_csrf'),
        next: `/approvals/${id}`,
        name: 'ada',
        password: 'ada password',
      });
      assert.equal(post.res.headers.get('location'), `/approvals/${id}`, 'the review_url opens after login');
      const evil = await web.post('/login', {
        _csrf: 'x',
        next: 'https://evil.example/',
        name: 'ada',
        password: 'ada password',
      });
      assert.notEqual(evil.res.headers.get('location'), 'https://evil.example/');
    });

    it('logs in with a fresh HttpOnly SameSite=Strict session cookie, and audits logins', async () => {
      const web = new WebClient(server.url);
      web.cookies.set('cs_session', 'planted-by-an-attacker');
      const res = await web.login('ada', 'ada password');
      assert.equal(res.res.status, 303);
      const cookie = res.setCookies.find((c) => c.startsWith('cs_session='))!;
      assert.match(cookie, /HttpOnly/i);
      assert.match(cookie, /SameSite=Strict/i);
      assert.doesNotMatch(cookie, /planted-by-an-attacker/);
      const queue = await web.get('/approvals');
      assert.equal(queue.res.status, 200);
      assert.match(queue.html, /Approval requests/);
      const rows = await server.sql('audit_events').where({ kind: 'user.login', actor: 'ada' });
      assert.ok(rows.length >= 1);
    });

    it('refuses a wrong password, audits it, and rate-limits repeated failures per user', async () => {
      const web = new WebClient(server.url);
      for (let i = 0; i < 3; i++) {
        const bad = await web.login('locked', 'wrong');
        assert.equal(bad.res.status, 401);
      }
      const blocked = await web.login('locked', 'locked password');
      assert.equal(blocked.res.status, 429, 'even the right password waits once the limit is hit');
      assert.ok(blocked.res.headers.get('retry-after'));
      const failed = await server.sql('audit_events').where({ kind: 'user.login_failed', actor: 'locked' });
      assert.equal(failed.length, 3);
      const other = await new WebClient(server.url).login('ada', 'ada password');
      assert.equal(other.res.status, 303, 'other users are not locked out');
    });

    it('refuses a login form without its token', async () => {
      const web = new WebClient(server.url);
      const res = await web.post('/login', { _csrf: 'forged', name: 'ada', password: 'ada password' });
      assert.equal(res.res.status, 403);
      assert.equal(web.cookies.has('cs_session'), false);
    });

    it('shows the queue oldest first with counts, filters and paging', async () => {
      const web = new WebClient(server.url);
      await web.login('ada', 'ada password');
      const first = await draft('queue one');
      const second = await draft('queue two');
      const res = await web.get('/approvals');
      assert.ok(res.html.indexOf(first) < res.html.indexOf(second), 'oldest first');
      assert.match(res.html, /pending <span class="count">\d+<\/span>/);
      const filtered = await web.get('/approvals?status=pending&agent=nobody');
      assert.match(filtered.html, /No pending requests/);
      const byTool = await web.get('/approvals?status=pending&tool=send_message');
      assert.ok(byTool.html.includes(first));
      const history = await web.get('/approvals?status=rejected');
      assert.equal(history.res.status, 200);
    });

    it('renders content, file names and target names as inert text', async () => {
      const web = new WebClient(server.url);
      await web.login('ada', 'ada password');
      const id = await draft(`${XSS}\nשלום 你好 🙂`, 'ct_evil');
      fs.mkdirSync(server.services.config.files.outbound_dir, { recursive: true });
      const evilName = '<svg onload=alert(1)>.txt';
      fs.writeFileSync(path.join(server.services.config.files.outbound_dir, evilName), `${XSS} in a file`);
      const file = await call(agent, 'isphere_send_file', {
        target_type: 'contact',
        target_id: 'ct_alice',
        file_path: evilName,
      });
      for (const requestId of [id, file.approval.approval_request_id as string]) {
        const page = await web.get(`/approvals/${requestId}`);
        assert.equal(page.res.status, 200);
        assert.ok(!page.html.includes('<script>alert'), 'no live script tag');
        assert.ok(!page.html.includes('<img src=x'), 'no live img tag');
        assert.ok(!page.html.includes('<svg onload'), 'no live svg tag');
        assert.match(page.html, /&lt;script&gt;alert\(&quot;x&quot;\)&lt;\/script&gt;/);
      }
      const text = await web.get(`/approvals/${id}`);
      assert.match(text.html, /<pre class="content" dir="auto">/);
      assert.ok(text.html.includes('שלום 你好 🙂'));
      assert.match(text.res.headers.get('content-security-policy') ?? '', /default-src 'none'/);
      assert.equal(text.res.headers.get('x-content-type-options'), 'nosniff');
    });

    it('says after a decision what became of the request, in words', async () => {
      const id = await draft('worded');
      const chair = new WebClient(server.url);
      await chair.login('ada', 'ada password');
      const csrf = WebClient.field((await chair.get(`/approvals/${id}`)).html, '_csrf');
      const posted = await chair.post(`/approvals/${id}/decision`, { decision: 'approve', _csrf: csrf });
      assert.equal(posted.res.status, 303);
      const after = await chair.get(`/approvals/${id}?done=approved`);
      assert.match(after.html, /Recorded: the request is approved\. The agent can now execute it\./);
      // A write that ran before the page answered (a task) is said as such, not "now succeeded".
      const view = await call(agent, 'isphere_get_approval', { approval_request_id: id });
      const ran = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: 'worded',
        dry_run: false,
        approval_id: view.approval.approval_id,
      });
      assert.equal(ran.ok, true, JSON.stringify(ran.error));
      const done = await chair.get(`/approvals/${id}?done=approved`);
      assert.match(done.html, /its write has already run and succeeded/);
      assert.doesNotMatch(done.html, /is now succeeded/);
    });

    it('refuses decisions without a session, without or with a wrong CSRF token, by GET, or by non-chairs', async () => {
      const id = await draft('guarded');
      const anonymous = await new WebClient(server.url).post(`/approvals/${id}/decision`, {
        decision: 'approve',
        _csrf: 'x',
      });
      assert.equal(anonymous.res.status, 403);

      const chair = new WebClient(server.url);
      await chair.login('ada', 'ada password');
      const page = await chair.get(`/approvals/${id}`);
      const csrf = WebClient.field(page.html, '_csrf');
      assert.equal((await chair.post(`/approvals/${id}/decision`, { decision: 'approve' })).res.status, 403);
      assert.equal(
        (await chair.post(`/approvals/${id}/decision`, { decision: 'approve', _csrf: `${csrf}x` })).res
          .status,
        403,
      );
      const viaGet = await chair.get(`/approvals/${id}/decision?decision=approve&_csrf=${csrf}`);
      assert.equal(viaGet.res.status, 404);

      const auditor = new WebClient(server.url);
      await auditor.login('carl', 'carl password');
      const auditorPage = await auditor.get(`/approvals/${id}`);
      assert.doesNotMatch(auditorPage.html, /name="decision"/, 'no decision form for compliance');
      const forced = await auditor.post(`/approvals/${id}/decision`, {
        decision: 'approve',
        _csrf: WebClient.field(auditorPage.html, '_csrf'),
      });
      assert.equal(forced.res.status, 403);

      const view = await call(agent, 'isphere_get_approval', { approval_request_id: id });
      assert.equal(view.approval.status, 'pending', 'nothing changed');
    });

    it('refuses the owner of the requesting agent', async () => {
      const { token } = await createAgent(server.sql, { name: 'olga-agent', owner: 'olga' });
      const olgasAgent = await connectHttp(server.url, token);
      const res = await call(olgasAgent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_alice',
        content_text: 'mine',
      });
      await olgasAgent.close();
      const id: string = res.approval.approval_request_id;
      const olga = new WebClient(server.url);
      await olga.login('olga', 'olga password');
      const page = await olga.get(`/approvals/${id}`);
      const post = await olga.post(`/approvals/${id}/decision`, {
        decision: 'approve',
        _csrf: WebClient.field(page.html, '_csrf'),
      });
      assert.equal(post.res.status, 403);
      assert.match(post.html, /owns agent olga-agent/);
    });

    it('approves once; the same decision again changes nothing; a rejection needs a note the agent can read', async () => {
      const chair = new WebClient(server.url);
      await chair.login('ada', 'ada password');
      const id = await draft('approve me in the web form');
      const page = await chair.get(`/approvals/${id}`);
      const csrf = WebClient.field(page.html, '_csrf');
      const ok = await chair.post(`/approvals/${id}/decision`, {
        decision: 'approve',
        note: 'fine',
        _csrf: csrf,
      });
      assert.equal(ok.res.status, 303);
      assert.equal(ok.res.headers.get('location'), `/approvals/${id}?done=approved`);
      const again = await chair.post(`/approvals/${id}/decision`, {
        decision: 'approve',
        note: 'fine',
        _csrf: csrf,
      });
      assert.equal(again.res.status, 303);
      const rows = await server
        .sql('audit_events')
        .where({ kind: 'approval.approved', approval_request_id: id });
      assert.equal(rows.length, 1);

      const id2 = await draft('reject me in the web form');
      const noNote = await chair.post(`/approvals/${id2}/decision`, {
        decision: 'reject',
        note: ' ',
        _csrf: csrf,
      });
      assert.equal(noNote.res.status, 400);
      await chair.post(`/approvals/${id2}/decision`, {
        decision: 'reject',
        note: 'Wrong recipient — נמען שגוי',
        _csrf: csrf,
      });
      const seen = await call(agent, 'isphere_get_approval', { approval_request_id: id2 });
      assert.equal(seen.approval.status, 'rejected');
      assert.equal(seen.approval.note, 'Wrong recipient — נמען שגוי');
    });

    it('ends sessions at logout and after the idle timeout', async () => {
      const web = new WebClient(server.url);
      await web.login('ada', 'ada password');
      const page = await web.get('/approvals');
      const stolen = web.cookies.get('cs_session')!;
      await web.post('/logout', { _csrf: WebClient.field(page.html, '_csrf') });
      const replay = new WebClient(server.url);
      replay.cookies.set('cs_session', stolen);
      assert.equal((await replay.get('/approvals')).res.status, 303, 'a logged-out session id is dead');

      const idle = new WebClient(server.url);
      await idle.login('ada', 'ada password');
      await server.sql('web_sessions').update({ last_seen_at: new Date(Date.now() - 31 * 60 * 1000) });
      assert.equal((await idle.get('/approvals')).res.status, 303);
    });

    it('posts a signed notice without the message body for each new request', async () => {
      notices.length = 0;
      const id = await draft('secret body text');
      const notice = await waitFor('the notice for the new request', async () =>
        notices.find((n) => n.body.includes(id)),
      );
      const expected = createHmac('sha256', 'a-webhook-secret-of-some-length')
        .update(`${String(notice.headers['x-countersign-timestamp'])}.${notice.body}`)
        .digest('hex');
      assert.equal(notice.headers['x-countersign-signature'], `sha256=${expected}`);
      const parsed = JSON.parse(notice.body) as { text: string; review_url: string };
      assert.match(parsed.text, /New approval request/);
      assert.ok(parsed.review_url.endsWith(`/approvals/${id}`));
      assert.ok(!notice.body.includes('secret body text'));
    });
  });
}

describe('web limits on pglite', () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer('pglite', {
      COUNTERSIGN_LOGIN_FAILURES_PER_IP: '2',
      COUNTERSIGN_LOGIN_FAILURES_PER_USER: '100',
      // Nothing listens here: every notice fails.
      COUNTERSIGN_WEBHOOK_URL: 'http://127.0.0.1:9/unreachable',
      COUNTERSIGN_WEBHOOK_SECRET: 'a-webhook-secret-of-some-length',
    });
    await createUser(server.sql, { name: 'ivy', roles: ['chair'], password: 'ivy password' });
  });
  after(async () => server?.stop());

  it('limits failed sign-ins per client address, whatever the names tried', async () => {
    for (const name of ['guess-1', 'guess-2'])
      assert.equal((await new WebClient(server.url).login(name, 'x')).res.status, 401);
    assert.equal((await new WebClient(server.url).login('ivy', 'ivy password')).res.status, 429);
  });

  it('ends a session at its absolute lifetime even when it is in use', async () => {
    const user = (await import('../../src/accounts/users.ts')).checkCredentials;
    const ivy = (await user(server.sql, 'ivy', 'ivy password')) as User;
    const session = await server.services.sessions.create(ivy);
    const web = new WebClient(server.url);
    web.cookies.set('cs_session', session.id);
    assert.equal((await web.get('/approvals')).res.status, 200);
    await server
      .sql('web_sessions')
      .update({ created_at: new Date(Date.now() - 13 * 3600 * 1000), last_seen_at: new Date() });
    assert.equal((await web.get('/approvals')).res.status, 303);
  });

  it('never lets a failing webhook hold up or fail a dry run', async () => {
    const agent = await connectHttp(server.url, server.demoToken);
    const res = await call(agent, 'isphere_send_message', {
      target_type: 'contact',
      target_id: 'ct_alice',
      content_text: 'notify me',
    });
    assert.equal(res.ok, true);
    assert.equal(res.approval.status, 'pending');
    await agent.close();
  });
});
