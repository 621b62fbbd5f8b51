import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import canonicalize from 'canonicalize';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser, setUserEmail } from '../../src/accounts/users.ts';
import { redactedConfig } from '../../src/app/config-digest.ts';
import { loadConfig } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import { deliveryAttempts, detailsOf } from '../helpers/audit-rows.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';
import { startSlackStandIn, type SlackCall, type SlackStandIn } from '../helpers/slack-standin.ts';

const BOT_TOKEN = 'xoxb-bot-token-nobody-may-see';
const SIGNING_SECRET = 'slack-signing-secret-nobody-may-see';
const CHANNEL = 'C0APPROVALS';

type Block = Record<string, unknown>;

/** A callback as Slack sends it: form-encoded `payload`, signed with `secret` at `timestamp`. */
function signed(payload: unknown, opts: { timestamp?: number; secret?: string } = {}) {
  const body = new URLSearchParams({ payload: JSON.stringify(payload) }).toString();
  const timestamp = String(opts.timestamp ?? Math.floor(Date.now() / 1000));
  const signature = `v0=${createHmac('sha256', opts.secret ?? SIGNING_SECRET)
    .update(`v0:${timestamp}:${body}`)
    .digest('hex')}`;
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
  describe(`approvals in Slack on ${kind}`, () => {
    let server: TestServer;
    let slack: SlackStandIn;
    let agent: Client;
    let clicks = 0;

    const post = (req: { body: string; headers: Record<string, string> }) =>
      fetch(`${server.url}/slack/interactions`, { method: 'POST', ...req });
    const draft = async (client: Client, content_text: string) => {
      const res = await call(client, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text,
      });
      assert.equal(res.ok, true, JSON.stringify(res.error));
      return { id: res.approval.approval_request_id as string, sha256: res.content_sha256 as string };
    };
    const callsOf = (method: string, pred: (c: SlackCall) => boolean = () => true) =>
      slack.calls.filter((c) => c.method === method && pred(c));
    /** The request's message, once the deliverer posted it. */
    const posted = (id: string) =>
      waitFor(`the Slack message of ${id}`, async () =>
        callsOf('chat.postMessage', (c) => c.answer.ok === true && JSON.stringify(c.args).includes(id)).at(0),
      );
    /** A click on a message's button, as Slack sends it; `response_url` leads back to the stand-in. */
    const click = (user: string, action: 'approve' | 'reject', value: string) => {
      const n = `click-${++clicks}`;
      return {
        n,
        payload: {
          type: 'block_actions',
          user: { id: user, username: user.toLowerCase(), team_id: 'T0' },
          api_app_id: 'A0',
          trigger_id: `trigger-${n}`,
          response_url: slack.responseUrl(n),
          container: { type: 'message', channel_id: CHANNEL, message_ts: '1800000000.000001' },
          actions: [{ type: 'button', action_id: action, block_id: 'countersign_decision', value }],
        },
      };
    };
    const answersTo = (n: string) =>
      waitFor(`the answer to ${n}`, async () =>
        callsOf('response_url', (c) => String(c.args.path).endsWith(`/${n}`)).at(0),
      );
    const status = async (id: string) =>
      (await call(agent, 'isphere_get_approval', { approval_request_id: id })).approval as {
        status: string;
        note: string | null;
        approvers: string[];
      };
    const refusals = async (reason: string) =>
      (
        (await server.sql('audit_events').where({ kind: 'slack.refused' }).orderBy('seq')) as {
          details: unknown;
          actor: string | null;
          approval_request_id: string | null;
          result: string;
          error_code: string | null;
        }[]
      ).filter((r) => detailsOf(r).reason === reason);
    const usersInfoCalledFor = (user: string) =>
      callsOf('users.info', (c) => c.args.user === user && c.answer.ok === true).length > 0;
    const updatesOf = (ts: string) => callsOf('chat.update', (c) => c.args.ts === ts && c.answer.ok === true);

    before(async () => {
      slack = await startSlackStandIn({
        token: BOT_TOKEN,
        emails: { UBO: 'Bo@Example.org', UNOBODY: 'nobody@example.org' },
      });
      server = await startTestServer(kind, {
        COUNTERSIGN_SLACK_BOT_TOKEN: BOT_TOKEN,
        COUNTERSIGN_SLACK_SIGNING_SECRET: SIGNING_SECRET,
        COUNTERSIGN_SLACK_CHANNEL: CHANNEL,
        COUNTERSIGN_SLACK_API_BASE_URL: slack.apiBase,
        // UOLGAX names olga in other letters: the same person.
        COUNTERSIGN_SLACK_USERS: 'UADA=ada,UOLGA=olga,UOLGAX=Olga,UCY=cy',
        COUNTERSIGN_NOTIFY_POLL_MS: '100',
        COUNTERSIGN_NOTIFY_BACKOFF_MS: '50',
        COUNTERSIGN_NOTIFY_BACKOFF_MAX_MS: '200',
      });
      const knex = server.sql;
      await createUser(knex, { name: 'ada', roles: ['chair'], password: 'ada password' });
      await createUser(knex, { name: 'bo', roles: ['chair'], password: 'bo password' });
      await createUser(knex, { name: 'cy', roles: ['compliance'], password: 'cy password' });
      await createUser(knex, { name: 'olga', roles: ['chair'], password: 'olga password' });
      await knex.transaction((trx) => setUserEmail(trx, 'bo', 'bo@example.org'));
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
      await slack?.close();
    });

    it('posts a new request to the channel with its content, hash and buttons, and records where', async () => {
      // Short enough to be shown whole, so the message offers Approve (test/e2e/visible-notices.test.ts: longer).
      const content = `Quarterly figures: <b>bold</b> & @channel ${'x'.repeat(400)}`;
      const { id, sha256 } = await draft(agent, content);
      const message = await posted(id);
      assert.equal(message.args.channel, CHANNEL);
      const blocks = message.args.blocks as Block[];
      const text = JSON.stringify(blocks);
      assert.ok(text.includes(sha256), 'the content hash is shown');
      assert.ok(text.includes('Quarterly figures: <b>bold</b> & @channel'), 'the content, as plain text');
      assert.ok(text.includes(content), 'all of it');
      assert.ok(text.includes(`${server.url}/approvals/${id}`), 'with the link to the whole request');
      assert.ok(text.includes('demo'), 'the agent');
      const content_block = blocks.find((b) => JSON.stringify(b).includes('Quarterly figures')) as Block;
      assert.equal((content_block.text as Block).type, 'plain_text', 'never read as mrkdwn');
      const actions = blocks.find((b) => b.type === 'actions') as { elements: Block[] };
      assert.deepEqual(
        actions.elements.map((e) => [e.action_id, e.value]),
        [
          ['approve', `${id}:${sha256}`],
          ['reject', `${id}:${sha256}`],
        ],
      );
      const row = await waitFor('the recorded message', async () =>
        server.sql('slack_messages').where({ approval_request_id: id }).first(),
      );
      assert.equal(row.channel, CHANNEL);
      assert.equal(row.ts, message.answer.ts);
      const delivered = await waitFor('notification.delivered', async () =>
        server.sql('audit_events').where({ kind: 'notification.delivered', approval_request_id: id }).first(),
      );
      const facts = detailsOf(delivered);
      assert.deepEqual(
        [facts.event, facts.channel, facts.recipient, facts.attempt],
        ['requested', 'slack', CHANNEL, 1],
      );
    });

    it('approves on a signed Approve click of a mapped chair, and updates the message without buttons', async () => {
      const { id, sha256 } = await draft(agent, 'approve me in Slack');
      const message = await posted(id);
      const { n, payload } = click('UADA', 'approve', `${id}:${sha256}`);
      const res = await post(signed(payload));
      assert.equal(res.status, 200);
      const view = await waitFor('the approval', async () => {
        const v = await status(id);
        return v.status === 'approved' ? v : undefined;
      });
      assert.deepEqual(view.approvers, ['ada']);
      const [decided] = await server
        .sql('audit_events')
        .where({ kind: 'approval.approved', approval_request_id: id });
      assert.equal(decided.actor, 'ada', 'the decision is the mapped user’s');
      const update = await waitFor('the message update', async () =>
        updatesOf(String(message.answer.ts)).at(0),
      );
      const blocks = update.args.blocks as Block[];
      assert.ok(!blocks.some((b) => b.type === 'actions'), 'no buttons any more');
      assert.match(JSON.stringify(blocks), /Approved by ada/);
      assert.ok(JSON.stringify(blocks).includes(sha256), 'still shows what was approved');
      assert.match(String((await answersTo(n)).args.text), /approved/);
    });

    it('rejects through the modal: Reject opens views.open, the submitted note rejects it', async () => {
      const { id, sha256 } = await draft(agent, 'reject me in Slack');
      const message = await posted(id);
      const { payload } = click('UBO', 'reject', `${id}:${sha256}`);
      assert.equal((await post(signed(payload))).status, 200);
      const opened = await waitFor('views.open', async () =>
        callsOf('views.open', (c) => c.args.trigger_id === payload.trigger_id).at(0),
      );
      assert.equal(opened.answer.ok, true);
      const modal = opened.args.view as { callback_id: string; private_metadata: string; blocks: Block[] };
      assert.equal(modal.callback_id, 'countersign_reject');
      assert.ok(usersInfoCalledFor('UBO'), 'bo is found by the e-mail address of his Slack profile');
      assert.equal((await status(id)).status, 'pending', 'nothing decided by opening the form');

      const submission = {
        type: 'view_submission',
        user: { id: 'UBO', team_id: 'T0' },
        view: {
          id: opened.answer.view && (opened.answer.view as { id: string }).id,
          callback_id: modal.callback_id,
          private_metadata: modal.private_metadata,
          state: { values: { note: { note: { type: 'plain_text_input', value: 'wrong recipient' } } } },
        },
      };
      const res = await post(signed(submission));
      assert.equal(res.status, 200);
      assert.equal(await res.text(), '{}', 'the modal closes');
      const view = await status(id);
      assert.equal(view.status, 'rejected');
      assert.equal(view.note, 'wrong recipient');
      const update = await waitFor('the message update', async () =>
        updatesOf(String(message.answer.ts)).at(0),
      );
      assert.match(JSON.stringify(update.args.blocks), /Rejected by bo.*Note: wrong recipient/);
    });

    it('refuses a callback with a bad signature: 401, audited, nothing decided', async () => {
      const { id, sha256 } = await draft(agent, 'forged click');
      const { payload } = click('UADA', 'approve', `${id}:${sha256}`);
      const before = (await refusals('bad_signature')).length;
      const forged = await post(signed(payload, { secret: 'some-other-signing-secret' }));
      assert.equal(forged.status, 401);
      assert.equal(((await forged.json()) as { reason: string }).reason, 'bad_signature');
      const unsigned = await post({
        body: signed(payload).body,
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
      });
      assert.equal(unsigned.status, 401);
      const rows = await refusals('bad_signature');
      assert.equal(rows.length, before + 2);
      assert.equal(rows.at(-1)!.result, 'error');
      assert.equal((await status(id)).status, 'pending');
    });

    it('refuses a stale timestamp, even signed: 401, audited', async () => {
      const { id, sha256 } = await draft(agent, 'old click');
      const { payload } = click('UADA', 'approve', `${id}:${sha256}`);
      const res = await post(signed(payload, { timestamp: Math.floor(Date.now() / 1000) - 6 * 60 }));
      assert.equal(res.status, 401);
      assert.equal(((await res.json()) as { reason: string }).reason, 'stale_timestamp');
      assert.equal((await refusals('stale_timestamp')).length, 1);
      assert.equal((await status(id)).status, 'pending');
    });

    it('refuses a replayed callback: the same signature and timestamp twice', async () => {
      const { id, sha256 } = await draft(agent, 'click once');
      await posted(id);
      const req = signed(click('UNOBODY', 'approve', `${id}:${sha256}`).payload);
      assert.equal((await post(req)).status, 200);
      const again = await post(req);
      assert.equal(again.status, 401);
      assert.equal(((await again.json()) as { reason: string }).reason, 'replayed');
      assert.equal((await refusals('replayed')).length, 1);
    });

    it('forgets seen callbacks after ten minutes, on the next callback', async () => {
      const knex = server.sql;
      const old = new Date(Date.now() - 11 * 60 * 1000).toISOString();
      await knex('slack_callbacks_seen').insert({ signature_sha256: 'f'.repeat(64), seen_at: old });
      const { id, sha256 } = await draft(agent, 'a later click');
      await post(signed(click('UNOBODY', 'approve', `${id}:${sha256}`).payload));
      const left = await knex('slack_callbacks_seen').where({ signature_sha256: 'f'.repeat(64) });
      assert.equal(left.length, 0);
      assert.ok((await knex('slack_callbacks_seen')).length >= 1, 'recent ones are kept');
    });

    it('refuses an unmapped Slack user, audited, and tells them', async () => {
      const { id, sha256 } = await draft(agent, 'clicked by a stranger');
      const { n, payload } = click('UNOBODY', 'approve', `${id}:${sha256}`);
      assert.equal((await post(signed(payload))).status, 200);
      const answer = await answersTo(n);
      assert.equal(answer.args.response_type, 'ephemeral');
      assert.match(String(answer.args.text), /not linked to a countersign user/);
      const rows = (await refusals('unmapped_user')).filter((r) => r.approval_request_id === id);
      assert.equal(rows.length, 1);
      assert.equal(detailsOf(rows[0]!).slack_user, 'UNOBODY');
      assert.equal(rows[0]!.actor, null);
      assert.equal((await status(id)).status, 'pending');
    });

    it('refuses the owner of the requesting agent approving its request, as the web form does', async () => {
      const { token } = await createAgent(server.sql, { name: 'olga-agent', owner: 'olga' });
      const olgasAgent = await connectHttp(server.url, token);
      const { id, sha256 } = await draft(olgasAgent, 'mine to approve?');
      await olgasAgent.close();
      const { n, payload } = click('UOLGA', 'approve', `${id}:${sha256}`);
      assert.equal((await post(signed(payload))).status, 200);
      assert.match(
        String((await answersTo(n)).args.text),
        /olga owns agent olga-agent and cannot decide its requests/,
      );
      const [row] = (await refusals('owner_of_agent')).filter((r) => r.approval_request_id === id);
      assert.ok(row);
      assert.equal(row.actor, 'olga');
      assert.equal(row.error_code, 'PERMISSION_DENIED');
      // A mapping that spells her name in capitals is still olga, still the owner.
      const again = click('UOLGAX', 'approve', `${id}:${sha256}`);
      assert.equal((await post(signed(again.payload))).status, 200);
      await answersTo(again.n);
      const both = (await refusals('owner_of_agent')).filter((r) => r.approval_request_id === id);
      assert.deepEqual(
        both.map((r) => [r.actor, detailsOf(r).slack_user]),
        [
          ['olga', 'UOLGA'],
          ['olga', 'UOLGAX'],
        ],
      );
      const request = await server.sql('approval_requests').where({ id }).first();
      assert.equal(request.status, 'pending');
      const decided = await server.sql('approval_decisions').where({ approval_request_id: id });
      assert.equal(decided.length, 0);
    });

    it('refuses a user without the chair role, and a click on a message that showed other content', async () => {
      const { id, sha256 } = await draft(agent, 'who may decide');
      const cy = click('UCY', 'approve', `${id}:${sha256}`);
      assert.equal((await post(signed(cy.payload))).status, 200);
      assert.match(String((await answersTo(cy.n)).args.text), /cy does not hold the chair role/);
      assert.equal((await refusals('not_chair')).filter((r) => r.approval_request_id === id).length, 1);

      const other = click('UADA', 'approve', `${id}:${'0'.repeat(64)}`);
      assert.equal((await post(signed(other.payload))).status, 200);
      assert.match(String((await answersTo(other.n)).args.text), /other content/);
      assert.equal(
        (await refusals('content_mismatch')).filter((r) => r.approval_request_id === id).length,
        1,
      );
      assert.equal((await status(id)).status, 'pending');
    });

    it('refuses a rejection without a note in the modal, and a decided request', async () => {
      const { id, sha256 } = await draft(agent, 'decided twice');
      await posted(id);
      const submit = (user: string, note: string | null) =>
        post(
          signed({
            type: 'view_submission',
            user: { id: user },
            view: {
              callback_id: 'countersign_reject',
              private_metadata: JSON.stringify({ id, sha256 }),
              state: { values: { note: { note: { type: 'plain_text_input', value: note } } } },
            },
          }),
        );
      const empty = await submit('UADA', '  ');
      assert.equal(empty.status, 200);
      assert.deepEqual(await empty.json(), {
        response_action: 'errors',
        errors: { note: 'Not decided: a rejection needs a note.' },
      });
      assert.equal((await submit('UADA', 'no')).status, 200);
      assert.equal((await status(id)).status, 'rejected');
      const late = click('UBO', 'approve', `${id}:${sha256}`);
      await post(signed(late.payload));
      assert.match(String((await answersTo(late.n)).args.text), /this request is rejected/);
      assert.equal((await refusals('not_pending')).filter((r) => r.approval_request_id === id).length, 1);
    });

    it('updates the message when the request expires', async () => {
      const { id } = await draft(agent, 'left to expire');
      const message = await posted(id);
      await server
        .sql('approval_requests')
        .where({ id })
        .update({ expires_at: new Date(0) });
      await server.services.maintain();
      const update = await waitFor('the expiry update', async () =>
        updatesOf(String(message.answer.ts)).at(0),
      );
      assert.match(JSON.stringify(update.args.blocks), /Expired/);
      assert.ok(!(update.args.blocks as Block[]).some((b) => b.type === 'actions'));
    });

    it('retries a post Slack rate-limits (429) or refuses (ok: false), recording each attempt', async () => {
      slack.failures.push({ method: 'chat.postMessage', failure: '429' });
      slack.failures.push({ method: 'chat.postMessage', failure: 'channel_not_found' });
      const { id } = await draft(agent, 'posted on the third try');
      await posted(id);
      const attempts = await deliveryAttempts(server.sql, id);
      assert.deepEqual(
        attempts.map((r) => [r.kind, detailsOf(r).attempt]),
        [
          ['notification.failed', 1],
          ['notification.failed', 2],
          ['notification.delivered', 3],
        ],
      );
      assert.match(String(detailsOf(attempts[0]!).error), /rate limited/);
      assert.match(String(detailsOf(attempts[1]!).error), /channel_not_found/);
    });

    it('keeps the bot token and the signing secret out of the audit log and the config digest', async () => {
      const rows = await server.sql('audit_events').select('details', 'kind');
      const all = JSON.stringify(rows);
      assert.ok(all.includes('slack.refused'));
      for (const secret of [BOT_TOKEN, SIGNING_SECRET]) assert.ok(!all.includes(secret), secret);
      const digested = canonicalize(redactedConfig(server.services.config))!;
      for (const secret of [BOT_TOKEN, SIGNING_SECRET]) assert.ok(!digested.includes(secret), secret);
      assert.ok(digested.includes(CHANNEL));
      assert.ok(
        slack.calls.every((c) => c.answer.error !== 'invalid_auth'),
        'every call carried the bot token',
      );
    });
  });
}

describe('the Slack configuration', () => {
  const env = {
    COUNTERSIGN_SLACK_BOT_TOKEN: BOT_TOKEN,
    COUNTERSIGN_SLACK_SIGNING_SECRET: SIGNING_SECRET,
    COUNTERSIGN_SLACK_CHANNEL: CHANNEL,
  };

  it("defaults to Slack's own API and maps users from COUNTERSIGN_SLACK_USERS", () => {
    const slack = loadConfig({ ...env, COUNTERSIGN_SLACK_USERS: 'U01ADA=ada, W02BO=bo' }, '/').notifications
      .slack!;
    assert.equal(slack.api_base_url, 'https://slack.com/api');
    assert.deepEqual(slack.users, { U01ADA: 'ada', W02BO: 'bo' });
  });

  it('refuses a channel name, a short signing secret and a missing token, naming the key', () => {
    const refused = (over: Record<string, string | undefined>, key: RegExp) =>
      assert.throws(
        () => loadConfig({ ...env, ...over }, '/'),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID') && key.test(err.message),
      );
    refused(
      { COUNTERSIGN_SLACK_CHANNEL: '#approvals' },
      /notifications\.slack\.channel.*COUNTERSIGN_SLACK_CHANNEL/,
    );
    refused({ COUNTERSIGN_SLACK_SIGNING_SECRET: 'short' }, /notifications\.slack\.signing_secret/);
    refused({ COUNTERSIGN_SLACK_BOT_TOKEN: undefined }, /notifications\.slack\.bot_token/);
    refused({ COUNTERSIGN_SLACK_USERS: 'ada=ada' }, /notifications\.slack\.users/);
  });
});
