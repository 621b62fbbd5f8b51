import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { SMTPServer } from 'smtp-server';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser, setUserEmail } from '../../src/accounts/users.ts';
import { loadConfig } from '../../src/config.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { createLogger } from '../../src/log.ts';
import { deliverDue } from '../../src/notify/deliver.ts';
import type { User } from '../../src/core/identity.ts';
import { deliveryAttempts, detailsOf } from '../helpers/audit-rows.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds, describeOnPostgres, openMigratedDatabase } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

const SMTP_PASSWORD = 'smtp-password-nobody-may-see';
const WEBHOOK_SECRET = 'a-webhook-secret-of-some-length';

interface Mail {
  to: string[];
  subject: string;
  text: string;
  raw: string;
}

/** A header's RFC 2047 encoded words (=?UTF-8?Q?…?= or ?B?), decoded. */
const decodeWords = (value: string) =>
  value
    .replace(/\?=\s+=\?/g, '?==?')
    .replace(/=\?UTF-8\?([QB])\?([^?]*)\?=/gi, (_m, how: string, text: string) =>
      how.toUpperCase() === 'B'
        ? Buffer.from(text, 'base64').toString('utf8')
        : Buffer.from(
            text
              .replace(/_/g, ' ')
              .replace(/=([0-9A-F]{2})/g, (_h, h: string) => String.fromCharCode(parseInt(h, 16))),
            'latin1',
          ).toString('utf8'),
    );

/** The text part of a single-part mail, its transfer encoding undone (nodemailer picks 7bit, QP or base64). */
function parseMail(raw: string, to: string[]): Mail {
  const split = raw.indexOf('\r\n\r\n');
  const head = raw.slice(0, split).replace(/\r\n[ \t]+/g, ' ');
  const body = raw.slice(split + 4);
  const header = (name: string) => new RegExp(`^${name}: (.*)$`, 'im').exec(head)?.[1] ?? '';
  const encoding = header('Content-Transfer-Encoding').toLowerCase();
  const bytes =
    encoding === 'base64'
      ? Buffer.from(body, 'base64')
      : encoding === 'quoted-printable'
        ? Buffer.from(
            body
              .replace(/=\r\n/g, '')
              .replace(/=([0-9A-F]{2})/g, (_m, h: string) => String.fromCharCode(parseInt(h, 16))),
            'latin1',
          )
        : Buffer.from(body, 'latin1');
  return { to, subject: decodeWords(header('Subject')), text: bytes.toString('utf8'), raw };
}

/**
 * A real SMTP server in this process. `hold()` makes it keep the next messages' DATA unanswered until
 * `release()`; `refuse` answers every message with a temporary failure (451).
 */
async function startSmtp() {
  const mails: Mail[] = [];
  let holding: { release: () => void; held: Promise<void> } | undefined;
  let heldOnce: () => void = () => {};
  const state = { refuse: false, logins: [] as string[] };
  const server = new SMTPServer({
    authOptional: true,
    allowInsecureAuth: true,
    disabledCommands: ['STARTTLS'],
    logger: false,
    onAuth(auth, _session, cb) {
      state.logins.push(`${auth.username}:${auth.password ?? ''}`);
      cb(null, { user: auth.username });
    },
    onData(stream, session, cb) {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => {
        void (async () => {
          heldOnce();
          if (holding) await holding.held;
          if (state.refuse)
            return cb(Object.assign(new Error('mailbox busy, try later'), { responseCode: 451 }));
          const to = session.envelope.rcptTo.map((r) => r.address);
          mails.push(parseMail(Buffer.concat(chunks).toString('latin1'), to));
          cb();
        })();
      });
    },
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    mails,
    state,
    port: (server.server.address() as AddressInfo).port,
    /** Holds DATA; resolves `arrived` when a message is being held. */
    hold() {
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      const arrived = new Promise<void>((r) => (heldOnce = r));
      holding = { release, held };
      return {
        arrived,
        release: () => {
          holding = undefined;
          heldOnce = () => {};
          release();
        },
      };
    },
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

for (const kind of databaseKinds()) {
  describe(`notifications by e-mail through the outbox on ${kind}`, () => {
    let server: TestServer;
    let smtp: Awaited<ReturnType<typeof startSmtp>>;
    let agent: Client;
    let ada: User;
    const rows = (kind: string, approval_request_id?: string) =>
      server
        .sql('audit_events')
        .where({ kind, ...(approval_request_id ? { approval_request_id } : {}) })
        .orderBy('seq') as Promise<{ details: unknown; result: string; error_code: string | null }[]>;
    const draft = async (client: Client, content_text: string) => {
      const res = await call(client, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text,
      });
      assert.equal(res.ok, true, JSON.stringify(res.error));
      return res;
    };
    const mailsFor = (id: string) => smtp.mails.filter((m) => m.text.includes(id));

    before(async () => {
      smtp = await startSmtp();
      server = await startTestServer(kind, {
        COUNTERSIGN_SMTP_HOST: '127.0.0.1',
        COUNTERSIGN_SMTP_PORT: String(smtp.port),
        COUNTERSIGN_SMTP_USER: 'relay-user',
        COUNTERSIGN_SMTP_PASSWORD: SMTP_PASSWORD,
        COUNTERSIGN_EMAIL_FROM: 'countersign <countersign@example.org>',
        COUNTERSIGN_NOTIFY_POLL_MS: '100',
        COUNTERSIGN_NOTIFY_BACKOFF_MS: '50',
        COUNTERSIGN_NOTIFY_BACKOFF_MAX_MS: '200',
        COUNTERSIGN_NOTIFY_RETRY_HORIZON_S: '2',
      });
      const knex = server.sql;
      ada = await createUser(knex, { name: 'ada', roles: ['chair'], password: 'ada password' });
      await createUser(knex, { name: 'bo', roles: ['chair'], password: 'bo password' });
      await createUser(knex, { name: 'cy', roles: ['compliance'], password: 'cy password' });
      await createUser(knex, { name: 'olga', roles: ['chair'], password: 'olga password' });
      const set = await runCli(['user', 'set', 'ada', '--email', 'ada@example.org'], server.env);
      assert.equal(set.code, 0, set.stderr);
      assert.match(set.stdout, /now has e-mail ada@example\.org/);
      for (const [name, email] of [
        ['cy', 'cy@example.org'],
        ['olga', 'olga@example.org'],
      ] as const) {
        await knex.transaction((trx) => setUserEmail(trx, name, email));
      }
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
      await smtp?.close();
    });

    it('sets a user e-mail address from the CLI, audited before and after; refuses a bad one', async () => {
      const [row] = await server
        .sql('audit_events')
        .where({ kind: 'user.email_changed' })
        .whereRaw("details->>'user' = 'ada'");
      assert.ok(row);
      assert.deepEqual(detailsOf(row), { user: 'ada', email_before: null, email_after: 'ada@example.org' });
      const bad = await runCli(['user', 'set', 'bo', '--email', 'not an address'], server.env);
      assert.notEqual(bad.code, 0);
      assert.match(bad.stderr, /email/i);
      const listed = await runCli(['user', 'list'], server.env);
      assert.match(listed.stdout, /^ada\tchair\tactive\tada@example\.org$/m);
      assert.match(listed.stdout, /^bo\tchair\tactive$/m);
    });

    it('answers the dry run without waiting for the mail, which then reaches the chairs with an address', async () => {
      const held = smtp.hold();
      const content = `${'Quarterly figures attached. '.repeat(18)}`.slice(0, 500) + 'TAIL-NOT-IN-MAIL';
      const res = await draft(agent, content);
      const id = res.approval.approval_request_id as string;
      // The answer is here while no mail has been accepted and no attempt recorded: the call did not wait.
      assert.equal(smtp.mails.length, 0);
      assert.equal((await rows('notification.delivered', id)).length, 0);
      await held.arrived; // the deliverer's attempt is under way, held at DATA
      held.release();

      const [mail] = await waitFor('the mail about the new request', async () => {
        const found = mailsFor(id);
        return found.length > 0 ? found : undefined;
      });
      const all = await waitFor('a mail to each chair with an address', async () => {
        const found = mailsFor(id).flatMap((m) => m.to);
        return found.length >= 2 ? found.sort() : undefined;
      });
      assert.deepEqual(
        all,
        ['ada@example.org', 'olga@example.org'],
        'chairs with an address: not bo, not cy',
      );
      assert.match(mail!.subject, /^\[countersign\] Approval needed: send_message to \S.* \(agent demo\)$/);
      assert.ok(mail!.text.includes(`${server.url}/approvals/${id}`), mail!.text);
      assert.ok(mail!.text.includes(res.content_sha256 as string));
      assert.ok(mail!.text.includes('Agent:   demo'));
      assert.ok(mail!.text.includes(content.slice(0, 120)));
      assert.ok(!mail!.text.includes('TAIL-NOT-IN-MAIL'), 'only the first 500 characters');
      for (const secret of [SMTP_PASSWORD, server.demoToken]) assert.ok(!mail!.raw.includes(secret));
      const logins = smtp.state.logins;
      assert.ok(
        logins.length > 0 && logins.every((l) => l === `relay-user:${SMTP_PASSWORD}`),
        'signs in to the relay',
      );

      const delivered = await waitFor('a notification.delivered row per mail', async () => {
        const r = await rows('notification.delivered', id);
        return r.length === 2 ? r.map(detailsOf) : undefined;
      });
      assert.deepEqual(
        delivered.sort((a, b) => String(a.recipient).localeCompare(String(b.recipient))),
        ['ada@example.org', 'olga@example.org'].map((recipient) => ({
          event: 'requested',
          channel: 'email',
          recipient,
          attempt: 1,
          agent_name: 'demo',
        })),
      );
      const outbox = await server.sql('notification_outbox').where({ approval_request_id: id });
      assert.deepEqual(
        outbox.map((o: { state: string; channel: string }) => [o.channel, o.state]),
        [
          ['email', 'delivered'],
          ['email', 'delivered'],
        ],
      );
    });

    it('mails the decision, without the approval_id; never mails the owner of the requesting agent', async () => {
      const olgas = await createAgent(server.sql, { name: 'olgas-bot', owner: 'olga' });
      const bot = await connectHttp(server.url, olgas.token);
      try {
        const id = (await draft(bot, 'from the bot olga owns')).approval.approval_request_id as string;
        const view = await server.services.approvals.decide({ id, user: ada, decision: 'approve' });
        const decided = await waitFor('the decision mail', async () =>
          mailsFor(id).find((m) => m.subject.includes('Approved')),
        );
        assert.match(decided.text, /was approved by ada/);
        assert.ok(!decided.raw.includes(view.approval_id!), 'the approval_id is a bearer credential');
        const recipients = mailsFor(id).flatMap((m) => m.to);
        assert.ok(
          recipients.length >= 2 && recipients.every((r) => r === 'ada@example.org'),
          String(recipients),
        );
      } finally {
        await bot.close();
      }
    });

    it('mails a rejection with its note', async () => {
      const id = (await draft(agent, 'to be turned down')).approval.approval_request_id as string;
      await server.services.approvals.decide({ id, user: ada, decision: 'reject', note: 'wrong recipient' });
      const rejected = await waitFor('the rejection mail', async () =>
        mailsFor(id).find((m) => m.subject.includes('Rejected')),
      );
      assert.match(rejected.text, /was rejected by ada/);
      assert.match(rejected.text, /Note: +wrong recipient/);
    });

    it('mails an expiry', async () => {
      const id = (await draft(agent, 'left to expire')).approval.approval_request_id as string;
      await server
        .sql('approval_requests')
        .where({ id })
        .update({ expires_at: new Date(0) });
      await server.services.maintain();
      const expired = await waitFor('the expiry mail', async () =>
        mailsFor(id).find((m) => m.subject.includes('Expired')),
      );
      assert.match(expired.text, /expired/);
    });

    it('retries through an SMTP outage with backoff, then records notification.failed; the call never waited', async () => {
      smtp.state.refuse = true;
      try {
        const res = await draft(agent, 'sent while the relay refuses');
        assert.equal(res.approval.status, 'pending');
        const id = res.approval.approval_request_id as string;
        // One outbox row per chair with an address (ada, olga): follow ada's.
        const final = await waitFor('the final notification.failed row', async () => {
          const failed = (await rows('notification.failed', id)).filter(
            (r) => detailsOf(r).recipient === 'ada@example.org',
          );
          return failed.some((r) => detailsOf(r).final === true) ? failed : undefined;
        });
        assert.ok(final.length >= 2, `retried: ${final.length} attempts`);
        final.forEach((r, i) => {
          const d = detailsOf(r);
          assert.equal(d.attempt, i + 1);
          assert.equal(d.final, i === final.length - 1);
          assert.match(String(d.error), /451|busy/);
          assert.equal(r.result, 'error');
          assert.ok(!JSON.stringify(d).includes(SMTP_PASSWORD));
        });
        const [row] = await server
          .sql('notification_outbox')
          .where({ approval_request_id: id, recipient: 'ada@example.org' });
        assert.equal(row.state, 'failed');
        assert.equal(Number(row.attempts), final.length);
        assert.equal((await rows('notification.delivered', id)).length, 0);
      } finally {
        smtp.state.refuse = false;
      }
    });
  });
}

describe('the webhook through the outbox on pglite', () => {
  let server: TestServer;
  let hook: http.Server;
  let failuresLeft = 2;
  const notices: { body: string; headers: http.IncomingHttpHeaders }[] = [];

  before(async () => {
    hook = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        if (failuresLeft-- > 0) {
          res.statusCode = 503;
          return res.end('down for a moment');
        }
        notices.push({ body, headers: req.headers });
        res.end('ok');
      });
    });
    await new Promise<void>((r) => hook.listen(0, '127.0.0.1', () => r()));
    server = await startTestServer('pglite', {
      COUNTERSIGN_WEBHOOK_URL: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/services/T0/B0/hook-path-secret`,
      COUNTERSIGN_WEBHOOK_SECRET: WEBHOOK_SECRET,
      COUNTERSIGN_NOTIFY_POLL_MS: '100',
      COUNTERSIGN_NOTIFY_BACKOFF_MS: '50',
      COUNTERSIGN_NOTIFY_EVENTS: 'requested',
    });
  });
  after(async () => {
    await server?.stop();
    hook?.close();
  });

  it('retries a refused notice until it is taken, signed as before, recording every attempt', async () => {
    const agent = await connectHttp(server.url, server.demoToken);
    const res = await call(agent, 'isphere_send_message', {
      target_type: 'contact',
      target_id: 'ct_david',
      content_text: 'secret body text',
    });
    await agent.close();
    const id = res.approval.approval_request_id as string;
    const notice = await waitFor('the notice', async () => notices.find((n) => n.body.includes(id)));
    const expected = createHmac('sha256', WEBHOOK_SECRET)
      .update(`${String(notice.headers['x-countersign-timestamp'])}.${notice.body}`)
      .digest('hex');
    assert.equal(notice.headers['x-countersign-signature'], `sha256=${expected}`);
    const body = JSON.parse(notice.body) as Record<string, unknown>;
    assert.equal(body.event, 'requested');
    assert.equal(body.agent, 'demo');
    assert.ok(!notice.body.includes('secret body text'), 'no message body unless configured');

    const audit = await deliveryAttempts(server.sql, id);
    assert.deepEqual(
      audit.map((r) => [r.kind, detailsOf(r).attempt]),
      [
        ['notification.failed', 1],
        ['notification.failed', 2],
        ['notification.delivered', 3],
      ],
    );
    for (const r of audit) {
      const d = JSON.stringify(detailsOf(r));
      assert.ok(!d.includes('hook-path-secret') && !d.includes(WEBHOOK_SECRET), d);
      assert.equal(detailsOf(r).recipient, `http://127.0.0.1:${(hook.address() as AddressInfo).port}`);
    }
  });

  it('queues only the configured events (here: new requests, not decisions)', async () => {
    const agent = await connectHttp(server.url, server.demoToken);
    const res = await call(agent, 'isphere_send_message', {
      target_type: 'contact',
      target_id: 'ct_david',
      content_text: 'decided quietly',
    });
    await agent.close();
    const id = res.approval.approval_request_id as string;
    const chair = await createUser(server.sql, {
      name: 'quiet',
      roles: ['chair'],
      password: 'quiet pw 1',
    });
    await server.services.approvals.decide({ id, user: chair, decision: 'reject', note: 'no' });
    const queued = (await server
      .sql('notification_outbox')
      .where({ approval_request_id: id })
      .select('event')) as { event: string }[];
    assert.deepEqual(
      queued.map((q) => q.event),
      ['requested'],
    );
  });
});

describe('notification settings', () => {
  it('names the key of a bad e-mail setting', () => {
    assert.throws(
      () => loadConfig({ COUNTERSIGN_SMTP_HOST: 'smtp.example.org' }, '/'),
      /notifications\.email\.from/,
    );
    assert.throws(
      () =>
        loadConfig(
          {
            COUNTERSIGN_SMTP_HOST: 'smtp.example.org',
            COUNTERSIGN_EMAIL_FROM: 'a@b.c',
            COUNTERSIGN_EMAIL_TO: 'nope',
          },
          '/',
        ),
      /notifications\.email\.to/,
    );
    assert.throws(
      () => loadConfig({ COUNTERSIGN_NOTIFY_EVENTS: 'requested,exploded' }, '/'),
      /notifications\.events/,
    );
  });
});

describeOnPostgres('the outbox across replicas on PostgreSQL', () => {
  it('delivers each notice once while three replicas claim side by side (skip locked)', async () => {
    const { testDb, db } = await openMigratedDatabase('postgres');
    const replicas = await Promise.all(
      [1, 2, 3].map(() => openDatabase({ url: testDb.url, pgliteDir: '', command: 'test' })),
    );
    try {
      const { agent } = await createAgent(db.knex, { name: 'many' });
      const now = new Date();
      const requests = Array.from({ length: 60 }, (_, i) => ({
        id: crypto.randomUUID(),
        agent_id: agent.id,
        tool: 'send_message',
        target_type: 'contact',
        target_id: 'ct_david',
        content_sha256: String(i).padStart(64, '0'),
        review: JSON.stringify({ content_text: `notice ${i}` }),
        status: 'pending',
        required_approvers: 1,
        policy_version: 'test',
        created_at: now,
        expires_at: new Date(now.getTime() + 3600_000),
      }));
      await db.knex('approval_requests').insert(requests);
      await db.knex('notification_outbox').insert(
        requests.map((r) => ({
          event: 'requested',
          approval_request_id: r.id,
          channel: 'webhook',
          recipient: 'http://127.0.0.1:1',
          payload: JSON.stringify({ agent_id: agent.id, approval_request_id: r.id }),
        })),
      );
      const sent = new Map<string, number>();
      const config = loadConfig({}, testDb.dataDir);
      const log = createLogger('silent');
      await Promise.all(
        replicas.map(async ({ knex }) => {
          const deps = {
            knex,
            audit: createAuditLog(knex),
            config,
            log,
            secrets: [],
            channels: {
              webhook: async (_to: string, notice: { approval_request_id: string }) => {
                sent.set(notice.approval_request_id, (sent.get(notice.approval_request_id) ?? 0) + 1);
                await new Promise((r) => setImmediate(r)); // let the other replicas claim meanwhile
              },
            },
          };
          while ((await deliverDue(deps)) > 0);
        }),
      );
      assert.equal(sent.size, 60);
      assert.ok(
        [...sent.values()].every((n) => n === 1),
        'no notice sent twice',
      );
      const delivered = await db
        .knex('audit_events')
        .where({ kind: 'notification.delivered' })
        .count({ n: '*' });
      assert.equal(Number(delivered[0]!.n), 60);
      const states = await db.knex('notification_outbox').distinct('state');
      assert.deepEqual(states, [{ state: 'delivered' }]);
    } finally {
      await Promise.all(replicas.map((r) => r.close()));
      await db.close();
      await testDb.drop();
    }
  });
});
