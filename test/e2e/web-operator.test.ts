import assert from 'node:assert/strict';
import os from 'node:os';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { agentToolName, storedToolName } from '../../src/core/tool-names.ts';
import { isLoopback } from '../../src/server/metrics-access.ts';
import { safeNext } from '../../src/web/login-pages.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/** Paths and URLs a `next` must never follow: other hosts however spelled, schemes, no path at all. */
const REFUSED_NEXT = [
  '//evil.example/',
  '/\\evil.example',
  '\\\\evil.example',
  '/\t/evil.example',
  'https://evil.example/audit',
  'javascript:alert(1)',
  'evil.example/audit',
  'audit',
  '',
];

/** Signs in through the form with `next`, returning where the server sends the browser. */
async function signInTo(web: WebClient, next: string, name: string, password: string) {
  const form = await web.get(`/login?next=${encodeURIComponent(next)}`);
  const posted = await web.post('/login', {
    _csrf: WebClient.field(form.html, '_csrf'),
    next,
    name,
    password,
  });
  assert.equal(posted.res.status, 303, posted.html);
  return { shown: WebClient.field(form.html, 'next'), location: posted.res.headers.get('location') };
}

/** The <time> element the server rendered for an instant: datetime, the UTC title and the UTC fallback. */
const timeOf = (iso: string) => {
  const t = new Date(iso).toISOString();
  return `<time datetime="${t}" title="${t.slice(0, 19).replace('T', ' ')} UTC">${t.slice(0, 16).replace('T', ' ')} UTC</time>`;
};

for (const kind of databaseKinds()) {
  describe(`the operators' web fixes on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    const draft = async (content_text: string) =>
      call(agent, 'isphere_send_message', { target_type: 'contact', target_id: 'ct_david', content_text });

    before(async () => {
      server = await startTestServer(kind);
      await createUser(server.sql, { name: 'ada', roles: ['chair'], password: 'ada password' });
      await createUser(server.sql, {
        name: 'carl',
        roles: ['compliance'],
        password: 'carl password',
      });
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it('sends an unsigned visitor of /audit to the login page and back to /audit, filters kept', async () => {
      const web = new WebClient(server.url);
      const target = '/audit?kind=tool.call&result=ok';
      const bounced = await web.get(target);
      assert.equal(bounced.res.status, 303);
      assert.equal(bounced.res.headers.get('location'), `/login?next=${encodeURIComponent(target)}`);
      const { shown, location } = await signInTo(web, target, 'carl', 'carl password');
      assert.equal(shown.replaceAll('&amp;', '&'), target, 'the form carries the page along');
      assert.equal(location, target);
      assert.equal((await web.get(location)).res.status, 200);
    });

    it('lands on /approvals for any next that is not a path on this origin', async () => {
      for (const next of REFUSED_NEXT) {
        const { shown, location } = await signInTo(new WebClient(server.url), next, 'ada', 'ada password');
        assert.equal(shown, '/approvals', `the form refuses ${JSON.stringify(next)}`);
        assert.equal(location, '/approvals', `sign-in refuses ${JSON.stringify(next)}`);
      }
      // The form's hidden field is only a convenience: a forged post is checked again.
      const web = new WebClient(server.url);
      const form = await web.get('/login');
      const forged = await web.post('/login', {
        _csrf: WebClient.field(form.html, '_csrf'),
        next: '//evil.example/',
        name: 'ada',
        password: 'ada password',
      });
      assert.equal(forged.res.headers.get('location'), '/approvals');
    });

    it('says on the request page which deadline it shows, before and after approval', async () => {
      const chair = new WebClient(server.url);
      await chair.login('ada', 'ada password');
      const dry = await draft('expiry explained');
      const id: string = dry.approval.approval_request_id;
      const pending = await chair.get(`/approvals/${id}`);
      assert.ok(pending.html.includes(timeOf(dry.approval.expires_at)), 'the request expiry, as a time');
      assert.match(pending.html, /unless decided — requests stay open 3 days/);
      assert.match(pending.html, /Once approved, the agent has 24 h from the decision to use the approval/);

      const page = await chair.get(`/approvals/${id}`);
      await chair.post(`/approvals/${id}/decision`, {
        decision: 'approve',
        _csrf: WebClient.field(page.html, '_csrf'),
      });
      const got = await call(agent, 'isphere_get_approval', { approval_request_id: id });
      assert.ok(got.approval.expires_at < dry.approval.expires_at, 'the approval is shorter-lived');
      const approved = await chair.get(`/approvals/${id}`);
      assert.ok(
        approved.html.includes(
          `Approved — the agent must use this approval by ${timeOf(got.approval.expires_at)}.\n` +
            '  <small>Approvals stay valid 24 h after the decision (<code>approval.execute_ttl_s</code>), ' +
            "in place of what was left of the request's 3 days.",
        ),
        'the use-by, and why it moved',
      );
      assert.doesNotMatch(approved.html, /unless decided/);
    });

    it('names the tool as agents call it on the pages, in get_approval and list_approvals', async () => {
      const dry = await draft('one name everywhere');
      const id: string = dry.approval.approval_request_id;
      const got = await call(agent, 'isphere_get_approval', { approval_request_id: id });
      assert.equal(got.approval.tool, 'isphere_send_message');
      const listed = await call(agent, 'isphere_list_approvals', { status: 'pending' });
      const mine = (listed.approvals as { approval_request_id: string; tool: string }[]).find(
        (a) => a.approval_request_id === id,
      );
      assert.equal(mine?.tool, 'isphere_send_message');

      const web = new WebClient(server.url);
      await web.login('ada', 'ada password');
      const detail = await web.get(`/approvals/${id}`);
      assert.match(detail.html, /<h1>isphere_send_message to /);
      for (const spelling of ['isphere_send_message', 'send_message']) {
        const queue = await web.get(`/approvals?status=pending&tool=${spelling}`);
        assert.ok(queue.html.includes(id), `the filter accepts ${spelling}`);
        assert.match(queue.html, /<td data-label="Tool"><code>isphere_send_message<\/code><\/td>/);
        assert.doesNotMatch(queue.html, /<code>send_message<\/code>/);
        assert.ok(queue.html.includes(`value="${spelling}"`), 'the filter shows what was typed');
      }
      assert.match((await web.get('/approvals')).html, /placeholder="isphere_send_message"/);
    });

    it('names the tool as agents call it in approvals list and show', async () => {
      const dry = await draft('one name at the command line');
      const id: string = dry.approval.approval_request_id;
      const env = { ...server.env, COUNTERSIGN_PASSWORD: 'ada password' };
      const list = await runCli(['approvals', 'list', '--as', 'ada'], env);
      assert.equal(list.code, 0, list.stderr);
      assert.match(list.stdout, new RegExp(`^${id}\\tpending\\tisphere_send_message\\tdemo\\t`, 'm'));
      const show = await runCli(['approvals', 'show', id, '--as', 'ada'], env);
      assert.equal(show.code, 0, show.stderr);
      assert.match(show.stdout, /^tool {8}isphere_send_message {3}agent demo$/m);
    });

    it('serves /metrics to a loopback client when no token is configured', async () => {
      const res = await fetch(`${server.url}/metrics`);
      assert.equal(res.status, 200);
      assert.match(await res.text(), /countersign_tool_calls_total/);
    });
  });
}

describe('/metrics with a token, and without one from another host, on pglite', () => {
  const TOKEN = 'a-metrics-token-for-the-scraper';
  let withToken: TestServer;
  let outside: TestServer | undefined;
  // An address of this machine that is not loopback: a client there is "another host" to the server.
  const external = Object.values(os.networkInterfaces())
    .flat()
    .find((i) => i && i.family === 'IPv4' && !i.internal)?.address;

  before(async () => {
    withToken = await startTestServer('pglite', { COUNTERSIGN_METRICS_TOKEN: TOKEN });
    if (external) {
      outside = await startTestServer('pglite', {
        COUNTERSIGN_HOST: external,
        COUNTERSIGN_ALLOWED_HOSTS: external,
      });
    }
  });
  after(async () => {
    await withToken?.stop();
    await outside?.stop();
  });

  const scrape = (url: string, authorization?: string) =>
    fetch(`${url}/metrics`, { headers: authorization ? { authorization } : {} });

  it('refuses a missing or wrong token, even from loopback, as problem JSON, and accepts the right one', async () => {
    for (const [authorization, reason] of [
      [undefined, 'metrics_token_missing'],
      ['Bearer wrong-token', 'metrics_token_invalid'],
      [`Bearer ${TOKEN}x`, 'metrics_token_invalid'],
      [`Basic ${Buffer.from(`x:${TOKEN}`).toString('base64')}`, 'metrics_token_missing'],
    ] as const) {
      const res = await scrape(withToken.url, authorization);
      assert.equal(res.status, 401, `${authorization} is refused`);
      assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/);
      assert.match(res.headers.get('www-authenticate') ?? '', /^Bearer /);
      const problem = (await res.json()) as { code: string; reason: string };
      assert.equal(problem.code, 'NOT_LOGGED_IN');
      assert.equal(problem.reason, reason);
      assert.doesNotMatch(JSON.stringify(problem), new RegExp(TOKEN));
    }
    const ok = await scrape(withToken.url, `Bearer ${TOKEN}`);
    assert.equal(ok.status, 200);
    assert.match(await ok.text(), /countersign_tool_calls_total/);
  });

  it('refuses a client on another address when no token is configured', { skip: !external }, async () => {
    const res = await scrape(outside!.url);
    assert.equal(res.status, 403);
    const problem = (await res.json()) as { code: string; reason: string; detail: string };
    assert.equal(problem.code, 'PERMISSION_DENIED');
    assert.equal(problem.reason, 'metrics_loopback_only');
    assert.match(problem.detail, /COUNTERSIGN_METRICS_TOKEN/);
    assert.equal((await fetch(`${outside!.url}/healthz`)).status, 200, 'only /metrics is held back');
  });
});

describe('the rules behind the pages', () => {
  it('takes loopback clients as loopback in IPv4, IPv6 and mapped forms, and nothing else', () => {
    for (const address of [
      '127.0.0.1',
      '127.1.2.3',
      '127.255.255.255',
      '::1',
      '0:0:0:0:0:0:0:1',
      '0000:0000:0000:0000:0000:0000:0000:0001',
      '::ffff:127.0.0.1',
      '::FFFF:127.9.8.7',
      '::ffff:7f00:1',
    ]) {
      assert.equal(isLoopback(address), true, address);
    }
    for (const address of [
      undefined,
      '',
      '0.0.0.0',
      '10.0.0.1',
      '192.0.2.2',
      '128.0.0.1',
      '127.0.0.256',
      '1127.0.0.1',
      '::',
      '::2',
      'fe80::1',
      '::ffff:10.0.0.1',
      '::ffff:8f00:1',
      'localhost',
    ]) {
      assert.equal(isLoopback(address), false, String(address));
    }
  });

  it('follows only paths on this origin after sign-in', () => {
    for (const next of ['/audit', '/audit?kind=tool.call&result=ok', '/approvals/abc', '/', '/a//b'])
      assert.equal(safeNext(next), next);
    for (const next of [...REFUSED_NEXT, '/login', '/login?next=/audit', undefined, 42, ['/audit']])
      assert.equal(safeNext(next), '/approvals', JSON.stringify(next));
  });

  it('spells built-in tools with the prefix and upstream tools as listed, and reads both back', () => {
    assert.equal(agentToolName('send_message', 'isphere_'), 'isphere_send_message');
    assert.equal(agentToolName('crm__set_note', 'isphere_'), 'crm__set_note');
    assert.equal(agentToolName('send_file', 'acme_'), 'acme_send_file');
    assert.equal(storedToolName('isphere_send_message', 'isphere_'), 'send_message');
    assert.equal(storedToolName('send_message', 'isphere_'), 'send_message');
    assert.equal(storedToolName('crm__set_note', 'isphere_'), 'crm__set_note');
    // An upstream whose name happens to start like the prefix keeps its name.
    assert.equal(storedToolName('a__x', 'a'), 'a__x');
    assert.equal(storedToolName('isphere_', 'isphere_'), 'isphere_');
  });
});
