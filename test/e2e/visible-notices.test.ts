import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { SMTPServer } from 'smtp-server';
import { createUser } from '../../src/accounts/users.ts';
import { importData } from '../../src/connectors/local/import.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';
import { startSlackStandIn, type SlackCall, type SlackStandIn } from '../helpers/slack-standin.ts';

const BOT_TOKEN = 'xoxb-bot-token-for-visible-notices';
const SIGNING_SECRET = 'slack-signing-secret-for-visible-notices';
const CHANNEL = 'C0VISIBLE';
const RLO = '\u202E';

type Block = Record<string, unknown>;

/** A real SMTP server in this process that keeps each mail's raw text. */
async function startSmtp() {
  const mails: string[] = [];
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS', 'AUTH'],
    logger: false,
    onData(stream, _session, cb) {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => {
        mails.push(Buffer.concat(chunks).toString('latin1'));
        cb();
      });
    },
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    mails,
    port: (server.server.address() as AddressInfo).port,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** A mail's text part, its transfer encoding (base64 or quoted-printable) undone. */
function textOf(raw: string): string {
  const split = raw.indexOf('\r\n\r\n');
  const head = raw.slice(0, split);
  const body = raw.slice(split + 4);
  if (/Content-Transfer-Encoding: base64/i.test(head)) return Buffer.from(body, 'base64').toString('utf8');
  if (/Content-Transfer-Encoding: quoted-printable/i.test(head)) {
    const bytes = body.replace(/=\r\n/g, '').replace(/=([0-9A-F]{2})/g, (_m, h: string) => `%${h}`);
    return decodeURIComponent(bytes.replace(/%(?![0-9A-F]{2})/g, '%25'));
  }
  return Buffer.from(body, 'latin1').toString('utf8');
}

/** A Slack callback, form-encoded and signed as Slack signs it. */
function signed(payload: unknown) {
  const body = new URLSearchParams({ payload: JSON.stringify(payload) }).toString();
  const timestamp = String(Math.floor(Date.now() / 1000));
  const signature = `v0=${createHmac('sha256', SIGNING_SECRET).update(`v0:${timestamp}:${body}`).digest('hex')}`;
  return {
    body,
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      'x-slack-request-timestamp': timestamp,
      'x-slack-signature': signature,
    },
  };
}

for (const kind of databaseKinds()) {
  describe(`notices that cannot show everything on ${kind}`, () => {
    let server: TestServer;
    let slack: SlackStandIn;
    let smtp: Awaited<ReturnType<typeof startSmtp>>;
    let agent: Client;
    let hook: http.Server;
    const hooked: string[] = [];

    const draft = async (args: Record<string, unknown>, tool = 'isphere_send_message') => {
      const res = await call(agent, tool, { target_type: 'contact', target_id: 'ct_david', ...args });
      assert.equal(res.ok, true, JSON.stringify(res.error));
      return { id: res.approval.approval_request_id as string, sha256: res.content_sha256 as string };
    };
    const posted = (id: string) =>
      waitFor(`the Slack message of ${id}`, async () => {
        const found = slack.calls.find(
          (c: SlackCall) =>
            c.method === 'chat.postMessage' && c.answer.ok === true && JSON.stringify(c.args).includes(id),
        );
        return found && (found.args.blocks as Block[]);
      });
    const mailed = (id: string) =>
      waitFor(`the mail about ${id}`, async () => smtp.mails.map(textOf).find((t) => t.includes(id)));
    const buttons = (blocks: Block[]) =>
      ((blocks.find((b) => b.type === 'actions') as { elements: Block[] }).elements ?? []).map(
        (e) => e.action_id,
      );
    const noApproveText = (blocks: Block[]) =>
      ((blocks.find((b) => b.block_id === 'countersign_no_approve')?.text as Block | undefined)?.text ??
        '') as string;

    before(async () => {
      slack = await startSlackStandIn({ token: BOT_TOKEN, emails: {} });
      hook = http.createServer((req, res) => {
        let body = '';
        req.on('data', (c: Buffer) => (body += c.toString()));
        req.on('end', () => {
          hooked.push(body);
          res.end('ok');
        });
      });
      await new Promise<void>((r) => hook.listen(0, '127.0.0.1', () => r()));
      smtp = await startSmtp();
      server = await startTestServer(kind, {
        COUNTERSIGN_SLACK_BOT_TOKEN: BOT_TOKEN,
        COUNTERSIGN_SLACK_SIGNING_SECRET: SIGNING_SECRET,
        COUNTERSIGN_SLACK_CHANNEL: CHANNEL,
        COUNTERSIGN_SLACK_API_BASE_URL: slack.apiBase,
        COUNTERSIGN_SLACK_USERS: 'UADA=ada',
        COUNTERSIGN_SMTP_HOST: '127.0.0.1',
        COUNTERSIGN_SMTP_PORT: String(smtp.port),
        COUNTERSIGN_EMAIL_FROM: 'countersign <countersign@example.org>',
        COUNTERSIGN_EMAIL_TO: 'chairs@example.org',
        COUNTERSIGN_WEBHOOK_URL: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/hook`,
        COUNTERSIGN_WEBHOOK_SECRET: 'a-webhook-secret-of-some-length',
        COUNTERSIGN_WEBHOOK_INCLUDE_CONTENT: 'true',
        COUNTERSIGN_NOTIFY_POLL_MS: '100',
        COUNTERSIGN_NOTIFY_BACKOFF_MS: '50',
        COUNTERSIGN_NOTIFY_BACKOFF_MAX_MS: '200',
      });
      await createUser(server.sql, { name: 'ada', roles: ['chair'], password: 'ada password' });
      await importData(server.sql, server.services.blobs, {
        contacts: [{ id: 'ct_fake', display_name: '\u0410lice Martin' }],
      });
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
      await slack?.close();
      await smtp?.close();
      hook?.close();
    });

    it('offers no Approve in Slack for content with markers, shows them with the warning', async () => {
      const { id } = await draft({ target_id: 'ct_fake', content_text: `Pay EUR ${RLO}00.000,05\u202C` });
      const blocks = await posted(id);
      const text = JSON.stringify(blocks);
      assert.deepEqual(buttons(blocks), ['reject']);
      assert.match(noApproveText(blocks), /invisible or reordering characters.*no Approve.*review page/);
      assert.ok(!text.includes(RLO) && !text.includes('\\u202e'), 'the override never reaches Slack');
      assert.ok(
        text.includes('EUR ⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧00.000,05⟦U+202C POP DIRECTIONAL FORMATTING⟧'),
      );
      assert.ok(text.includes('Warning: 2 invisible or reordering characters'));
      assert.ok(text.includes('Warning: The target looks like Alice Martin (ct_alice)'));
      const mail = await mailed(id);
      assert.ok(mail.includes('WARNING: 2 invisible or reordering characters'), mail);
      assert.ok(mail.includes('WARNING: The target looks like Alice Martin (ct_alice)'), mail);
      assert.ok(mail.includes('⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧00.000,05'), mail);
      assert.ok(mail.includes('The content holds invisible or reordering characters'), mail);
      assert.ok(!mail.includes(RLO));
      const notice = await waitFor('the webhook notice', async () => hooked.find((b) => b.includes(id)));
      const parsed = JSON.parse(notice) as { text: string };
      assert.ok(parsed.text.includes('EUR ⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧00.000,05'), 'the line people read');
      assert.ok(!parsed.text.includes(RLO));
    });

    it('shows a payload carried by variation selectors behind an emoji on every channel', async () => {
      // One selector per byte of "IBAN DE89 3704 0044 0532 0130 00, pw hunter2" behind a friendly 🙂.
      const secret = 'IBAN DE89 3704 0044 0532 0130 00, pw hunter2';
      const payload = Array.from(Buffer.from(secret), (b) =>
        String.fromCodePoint(b < 16 ? 0xfe00 + b : 0xe0100 + b - 16),
      ).join('');
      const content_text = `Thanks for the update, talk soon 🙂${payload}`;
      const n = secret.length;
      const { id, sha256 } = await draft({ content_text });
      const first = `🙂⟦U+E01${(secret.charCodeAt(0) - 16).toString(16).toUpperCase().padStart(2, '0')} VARIATION SELECTOR-`;
      // Slack: the markers, the count, no Approve, the review link.
      const blocks = await posted(id);
      const text = JSON.stringify(blocks);
      assert.deepEqual(buttons(blocks), ['reject']);
      assert.ok(text.includes(first), text);
      assert.ok(text.includes(`Warning: ${n} invisible or reordering characters`));
      assert.ok(text.includes(`${server.url}/approvals/${id}`), 'the review link');
      // An Approve click from elsewhere for it decides nothing.
      await fetch(`${server.url}/slack/interactions`, {
        method: 'POST',
        ...signed({
          type: 'block_actions',
          user: { id: 'UADA', username: 'ada', team_id: 'T0' },
          api_app_id: 'A0',
          trigger_id: 'trigger-vs',
          response_url: slack.responseUrl('visible-vs'),
          container: { type: 'message', channel_id: CHANNEL, message_ts: '1800000000.000019' },
          actions: [
            {
              type: 'button',
              action_id: 'approve',
              block_id: 'countersign_decision',
              value: `${id}:${sha256}`,
            },
          ],
        }),
      });
      await waitFor('the slack.refused row', async () => {
        const rows = (await server
          .sql('audit_events')
          .where({ kind: 'slack.refused', approval_request_id: id })) as { details: unknown }[];
        return rows.find((r) => detailsOf(r).reason === 'not_shown_in_full');
      });
      // E-mail: the markers, the count, sent to the review page.
      const mail = await mailed(id);
      assert.ok(mail.includes(first), mail);
      assert.ok(mail.includes(`WARNING: ${n} invisible or reordering characters`), mail);
      assert.match(mail, /review page before deciding/);
      // The review page: each selector a marker, counted above the content.
      const web = new WebClient(server.url);
      await web.login('ada', 'ada password');
      const { html } = await web.get(`/approvals/${id}`);
      assert.equal(html.match(/VARIATION SELECTOR-\d+⟧/g)?.length, n);
      assert.ok(
        html.indexOf('id="hidden-count"') > 0 &&
          html.indexOf('id="hidden-count"') < html.indexOf('<pre class="content"'),
      );
      // The CLI.
      const show = await runCli(['approvals', 'show', id, '--as', 'ada'], {
        ...server.env,
        COUNTERSIGN_PASSWORD: 'ada password',
      });
      assert.equal(show.code, 0, show.stderr);
      assert.match(show.stdout, new RegExp(`WARNING\\s+${n} invisible or reordering character`));
      assert.ok(show.stdout.includes(first), show.stdout);
      for (const out of [text, mail, html, show.stdout]) assert.ok(!out.includes(payload.slice(0, 2)));
      assert.equal(
        (await call(agent, 'isphere_get_approval', { approval_request_id: id })).approval.status,
        'pending',
      );
    });

    it('offers no Approve in Slack for content longer than it shows, says why, and the mail says so', async () => {
      const tail = 'Also transfer EUR 48,000 to IBAN DE00 0000 0000 0000 0000 00 today.';
      const { id, sha256 } = await draft({
        content_text: `${'All fine, see you at 10:00. '.repeat(20)}${tail}`,
      });
      const blocks = await posted(id);
      assert.deepEqual(buttons(blocks), ['reject']);
      assert.ok(!JSON.stringify(blocks).includes('EUR 48,000'), 'the tail is not shown');
      assert.match(noApproveText(blocks), /longer than Slack can show.*no Approve.*review page/);
      assert.ok(JSON.stringify(blocks).includes(`${server.url}/approvals/${id}`), 'the review link');
      const mail = await mailed(id);
      assert.ok(mail.includes('This mail shows only the first part of the content'), mail);
      assert.ok(mail.includes(`${server.url}/approvals/${id}`));
      assert.ok(
        !/Approve/.test(mail.replace('approve|reject', '')),
        'the mail offers no approval of its own',
      );

      // A click on an Approve button for it (from a message posted before) decides nothing.
      const res = await fetch(`${server.url}/slack/interactions`, {
        method: 'POST',
        ...signed({
          type: 'block_actions',
          user: { id: 'UADA', username: 'ada', team_id: 'T0' },
          api_app_id: 'A0',
          trigger_id: 'trigger-1',
          response_url: slack.responseUrl('visible-1'),
          container: { type: 'message', channel_id: CHANNEL, message_ts: '1800000000.000009' },
          actions: [
            {
              type: 'button',
              action_id: 'approve',
              block_id: 'countersign_decision',
              value: `${id}:${sha256}`,
            },
          ],
        }),
      });
      assert.equal(res.status, 200);
      const refused = await waitFor('the slack.refused row', async () => {
        const rows = (await server
          .sql('audit_events')
          .where({ kind: 'slack.refused', approval_request_id: id })) as { details: unknown }[];
        return rows.find((r) => detailsOf(r).reason === 'not_shown_in_full');
      });
      assert.ok(refused);
      const status = await call(agent, 'isphere_get_approval', { approval_request_id: id });
      assert.equal(status.approval.status, 'pending');
    });

    it('offers no Approve in Slack for a long content made long by its markers', async () => {
      const tags = Array.from({ length: 30 }, () => String.fromCodePoint(0xe0041)).join('');
      const { id } = await draft({ content_text: `See you at 10:00 tomorrow.${tags}` });
      const blocks = await posted(id);
      assert.deepEqual(buttons(blocks), ['reject']);
      assert.ok(JSON.stringify(blocks).includes('Warning: 30 invisible or reordering characters'));
    });

    it('offers no Approve in Slack for a file, whose bytes it cannot show', async () => {
      const outbound = server.services.config.files.outbound_dir;
      fs.mkdirSync(outbound, { recursive: true });
      fs.writeFileSync(path.join(outbound, 'minutes.txt'), 'Board minutes');
      const { id } = await draft({ file_path: 'minutes.txt' }, 'isphere_send_file');
      const blocks = await posted(id);
      assert.deepEqual(buttons(blocks), ['reject']);
      assert.match(noApproveText(blocks), /file's bytes cannot be shown in Slack/);
      assert.ok((await mailed(id)).includes("This mail does not show the file's bytes"));
    });
  });
}
