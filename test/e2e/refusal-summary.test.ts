import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import type { Knex } from 'knex';
import { createAuditLog } from '../../src/audit/log.ts';
import { createRefusals, type RefusalRow } from '../../src/audit/refusals.ts';
import type { Database } from '../../src/db/knex.ts';
import { createLogger } from '../../src/log.ts';
import { oidcEnv } from '../helpers/oidc-flow.ts';
import { freePort } from '../helpers/openid-provider.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';
import { startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

interface Row {
  kind: string;
  ts: string | Date;
  details: Record<string, unknown> | string;
}
const detailsOf = (r: Row) =>
  (typeof r.details === 'string' ? JSON.parse(r.details) : r.details) as Record<string, unknown>;
const minuteOf = (t: string | Date) => Math.floor(new Date(t).getTime() / 60_000);

/** The refusals of `kind` for `reason`, each row's own and the summaries' counts. */
async function tally(knex: Knex, kind: string, reason: string) {
  const rows = (await knex('audit_events')
    .whereIn('kind', [kind, 'auth.denied_summary'])
    .orderBy('seq')) as Row[];
  const own = rows.filter((r) => r.kind === kind && detailsOf(r).reason === reason);
  const summaries = rows
    .filter((r) => r.kind === 'auth.denied_summary')
    .map(detailsOf)
    .filter((d) => d.of_kind === kind && d.reason === reason);
  const summed = summaries.reduce((n, d) => n + Number(d.count), 0);
  return { own, summaries, summed };
}

/**
 * At most `n` own rows for each minute the refusals spanned, and at most one summary per address,
 * reason and minute.
 */
function assertBounded(t: Awaited<ReturnType<typeof tally>>, n: number) {
  const minutes = new Set([
    ...t.own.map((r) => minuteOf(r.ts)),
    ...t.summaries.map((d) => minuteOf(String(d.minute_start))),
  ]);
  assert.ok(t.own.length <= n * minutes.size, `${t.own.length} own rows in ${minutes.size} minutes`);
  const keys = t.summaries.map((d) => `${String(d.ip)} ${String(d.minute_start)}`);
  assert.equal(new Set(keys).size, keys.length, 'one summary per address, reason and minute');
  for (const d of t.summaries) {
    assert.ok(Number(d.count) >= 1);
    assert.ok(String(d.first_at) <= String(d.last_at));
  }
}

for (const kind of databaseKinds()) {
  describe(`refusal counting on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    const denied = (reason: string): RefusalRow => ({
      kind: 'auth.denied',
      result: 'error',
      error_code: 'UNAUTHENTICATED',
      details: { reason, transport: 'http', ip: 'x' },
    });

    it('keeps the first N a minute per address and reason, then sums the rest when the minute closes', async () => {
      let clock = Date.UTC(2026, 0, 1, 12, 0, 5);
      const audit = createAuditLog(db.knex);
      const log = createLogger('silent');
      // Two replicas on one database share one count.
      const [one, two] = [1, 2].map(() =>
        createRefusals({ knex: db.knex, audit, log, perMinute: 3, now: () => clock }),
      );
      for (let i = 0; i < 40; i++) {
        await (i % 2 ? one! : two!).record('198.51.100.7', denied('unknown_token'));
        clock += 100;
      }
      await one!.record('198.51.100.7', denied('missing_token'));
      await one!.record('203.0.113.9', denied('unknown_token'));
      // Past the share each replica counts in memory and adds its count to the shared counter soon after.
      const counter = await waitFor('both replicas add what they counted', async () => {
        const c = (await db
          .knex('refusal_counts')
          .where({ source: '198.51.100.7', reason: 'unknown_token' })
          .first()) as { count: number; pushed: number } | undefined;
        return c && Number(c.count) + Number(c.pushed) === 40 ? c : undefined;
      });
      assert.ok(
        Number(counter.count) <= 3 + 2,
        `${counter.count} asked one by one: the share, then one a replica`,
      );
      let t = await tally(db.knex, 'auth.denied', 'unknown_token');
      assert.equal(t.own.length, 4, 'three from 198.51.100.7 across both replicas, one from 203.0.113.9');
      assert.equal(t.summaries.length, 0, 'the minute is still open');

      // The next refusal after the minute closed writes its summary first.
      clock = Date.UTC(2026, 0, 1, 12, 1, 2);
      await two!.record('203.0.113.9', denied('unknown_token'));
      t = await tally(db.knex, 'auth.denied', 'unknown_token');
      assert.equal(t.summaries.length, 1);
      const [summary] = t.summaries;
      assert.equal(summary!.ip, '198.51.100.7');
      assert.equal(summary!.count, 37);
      assert.equal(summary!.first_at, new Date(Date.UTC(2026, 0, 1, 12, 0, 5, 300)).toISOString());
      assert.equal(summary!.last_at, new Date(Date.UTC(2026, 0, 1, 12, 0, 8, 900)).toISOString());
      assert.equal(summary!.minute_start, new Date(Date.UTC(2026, 0, 1, 12, 0)).toISOString());

      // A clean stop writes the open minute's summary too: nothing counted is lost.
      for (let i = 0; i < 5; i++) await one!.record('203.0.113.9', denied('unknown_token'));
      await one!.close();
      t = await tally(db.knex, 'auth.denied', 'unknown_token');
      assert.equal(t.own.length, 3 + 1 + 3);
      assert.equal(t.summed, 37 + 3);
      assert.equal(t.summaries.length, 2);
      assert.equal((await db.knex('refusal_counts').count({ n: '*' }))[0]!.n, 0, 'no counter left');
      await two!.close();
    });
    it('past the share, counts in memory and adds the count in bulk: a flood is not a statement a refusal', async () => {
      let clock = Date.UTC(2026, 0, 1, 14, 0, 5);
      const statements: string[] = [];
      const onQuery = (q: { sql: string }) => {
        if (q.sql.includes('refusal_counts')) statements.push(q.sql);
      };
      db.knex.on('query', onQuery);
      const log = createLogger('silent');
      const refusals = createRefusals({
        ...{ knex: db.knex, audit: createAuditLog(db.knex), log },
        ...{ perMinute: 3, now: () => clock },
      });
      try {
        for (let i = 0; i < 500; i++) {
          await refusals.record('192.0.2.9', denied('unknown_token'));
          clock += 10;
        }
        // The share (3) and the first past it ask one by one; the rest are counted here.
        assert.ok(statements.length < 20, `${statements.length} statements for 500 refusals`);
        // Added to the shared counter without a flush: what another replica's summary would read.
        await waitFor('the count added to the shared counter', async () => {
          const c = (await db.knex('refusal_counts').where({ source: '192.0.2.9' }).first()) as
            { count: number; pushed: number } | undefined;
          return c && Number(c.count) + Number(c.pushed) === 500 ? c : undefined;
        });
      } finally {
        db.knex.off('query', onQuery);
        await refusals.close();
      }
      const t = await tally(db.knex, 'auth.denied', 'unknown_token');
      const summary = t.summaries.find((d) => d.ip === '192.0.2.9');
      assert.equal(summary?.count, 497);
      assert.equal(summary?.first_at, new Date(Date.UTC(2026, 0, 1, 14, 0, 5, 30)).toISOString());
      assert.equal(summary?.last_at, new Date(Date.UTC(2026, 0, 1, 14, 0, 9, 990)).toISOString());
    });
    it("writes a closed minute's summary by itself when no refusal follows", async () => {
      let clock = Date.UTC(2026, 0, 1, 13, 0, 59, 900);
      const log = createLogger('silent');
      const refusals = createRefusals({
        ...{ knex: db.knex, audit: createAuditLog(db.knex), log },
        ...{ perMinute: 3, now: () => clock },
      });
      for (let i = 0; i < 8; i++) await refusals.record('192.0.2.44', denied('expired_token'));
      // The minute ends (and a second more, for the other replicas' last counts); nobody is refused again.
      clock = Date.UTC(2026, 0, 1, 13, 1, 1, 500);
      const summary = await waitFor('the summary of the closed minute', async () => {
        const t = await tally(db.knex, 'auth.denied', 'expired_token');
        return t.summaries.length > 0 ? t : undefined;
      });
      assert.equal(summary.own.length, 3);
      assert.equal(summary.summed, 5);
      await refusals.close();
    });
  });

  describe(`refused requests on ${kind} are recorded without flooding`, () => {
    const PER_MINUTE = 5;
    const SECRET = 'slack-signing-secret-nobody-may-see';
    let server: TestServer;
    before(async () => {
      server = await startTestServer(kind, {
        COUNTERSIGN_DENIED_ROWS_PER_MINUTE: String(PER_MINUTE),
        COUNTERSIGN_SLACK_BOT_TOKEN: 'xoxb-bot-token-nobody-may-see',
        COUNTERSIGN_SLACK_SIGNING_SECRET: SECRET,
        COUNTERSIGN_SLACK_CHANNEL: 'C0APPROVALS',
        COUNTERSIGN_SLACK_API_BASE_URL: 'http://127.0.0.1:9/api/',
        // Never asked: a callback without its attempt is refused before the provider is.
        ...oidcEnv('https://login.example.com/realms/staff', await freePort()),
      });
    });
    after(async () => server?.stop());

    /** Sends `total` requests, `parallel` at a time; each is refused with `status`, or one of `statuses`. */
    async function send(
      total: number,
      parallel: number,
      one: (i: number) => Promise<Response>,
      status: number | ((i: number) => number) = 401,
    ) {
      for (let i = 0; i < total; i += parallel) {
        const answers = await Promise.all(
          Array.from({ length: Math.min(parallel, total - i) }, (_, j) => one(i + j)),
        );
        for (const [j, res] of answers.entries()) {
          assert.equal(res.status, typeof status === 'number' ? status : status(i + j));
          await res.body?.cancel();
        }
      }
    }

    // 500 refusals are a hundred times the rows a minute allows (2,000 took this file's longest 19 s).
    it('500 bad bearer tokens from one client: N rows a minute, the rest summed', async () => {
      await send(500, 20, (i) =>
        fetch(new URL('/mcp', server.url), {
          method: 'POST',
          headers: {
            authorization: `Bearer cs_not-a-token-${i}`,
            'content-type': 'application/json',
            accept: 'application/json, text/event-stream',
          },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
        }),
      );
      // What a clean stop does first (services.close): the open minute's summary is written.
      await server.services.refusals.flush({ all: true });
      const own = await server.sql('audit_events').where('kind', 'auth.denied');
      const reason = detailsOf(own[0] as Row).reason as string;
      const t = await tally(server.sql, 'auth.denied', reason);
      assert.equal(t.own.length, own.length, 'every refusal had one reason');
      assert.equal(t.own.length + t.summed, 500, 'every refusal counted');
      assertBounded(t, PER_MINUTE);
    });

    it('unsigned Slack callbacks: N rows a minute, the rest summed', async () => {
      await send(300, 20, (i) => {
        const body = new URLSearchParams({
          payload: JSON.stringify({ type: 'block_actions', i }),
        }).toString();
        const timestamp = String(Math.floor(Date.now() / 1000));
        const forged = createHmac('sha256', 'not-the-secret').update(`v0:${timestamp}:${body}`).digest('hex');
        return fetch(new URL('/slack/interactions', server.url), {
          method: 'POST',
          headers: {
            'content-type': 'application/x-www-form-urlencoded',
            'x-slack-request-timestamp': timestamp,
            ...(i % 2 ? { 'x-slack-signature': `v0=${forged}` } : {}),
          },
          body,
        });
      });
      await server.services.refusals.flush({ all: true });
      const t = await tally(server.sql, 'slack.refused', 'bad_signature');
      assert.equal(t.own.length + t.summed, 300, 'every refusal counted');
      assertBounded(t, PER_MINUTE);
    });

    it('single sign-on callback GETs without their attempt: N rows a minute, the rest summed', async () => {
      const callback = (i: number) =>
        fetch(new URL(`/login/oidc/callback?code=c${i}&state=s${i}`, server.url), { redirect: 'manual' });
      // The first 20 (web.login_failures_per_ip) are checked and refused; the rest are over the limit.
      await send(300, 20, callback, (i) => (i < 20 ? 400 : 429));
      await server.services.refusals.flush({ all: true });
      const checked = await tally(server.sql, 'user.login_failed', 'no_attempt');
      const over = await tally(server.sql, 'user.login_failed', 'too_many_attempts');
      assert.equal(checked.own.length + checked.summed, 20, 'every checked refusal counted');
      assert.equal(over.own.length + over.summed, 280, 'every refusal over the limit counted');
      assertBounded(checked, PER_MINUTE);
      assertBounded(over, PER_MINUTE);
    });
  });
}
