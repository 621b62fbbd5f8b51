import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { loadProfiles, PROFILES_DIR, validateProfile } from '../../src/core/profiles.ts';
import { createRateLimiter, retryAfterSeconds } from '../../src/accounts/rate-limit.ts';
import { builtinTools } from '../../src/tools/index.ts';
import { isProfileError } from '../helpers/checks.ts';
import { runCli } from '../helpers/cli.ts';
import { slowHandlers } from '../helpers/faults.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

const GOOD = {
  name: 'x',
  allow: ['directory', 'messages', 'files', 'approvals', 'memory', 'upstream_read'],
  deny: { send: 'not for you', upstream_write: 'not for you either' },
};

describe('profile validation', () => {
  it('accepts the shipped profiles', () => {
    assert.deepEqual([...loadProfiles().keys()], ['all', 'drafting', 'readonly']);
  });

  it('refuses each malformed profile, naming the problem', () => {
    const cases: [unknown, RegExp][] = [
      [
        { ...GOOD, allow: ['directory', 'messages', 'files', 'approvals', 'upstream_read'] },
        /facet "memory" is named neither in allow nor in deny/,
      ],
      [{ ...GOOD, allow: [...GOOD.allow, 'memory'] }, /facet "memory" is named twice/],
      [{ ...GOOD, allow: [...GOOD.allow, 'send'] }, /facet "send" is named in both allow and deny/],
      [{ ...GOOD, deny: { ...GOOD.deny, send: '  ' } }, /deny reason for "send" is empty/],
      [{ ...GOOD, allow: [...GOOD.allow, 'teleport'] }, /unknown facet "teleport"/],
      [{ ...GOOD, dry_run_only: ['send'] }, /dry_run_only facet "send" is not allowed/],
      [{ ...GOOD, extra: 1 }, /profile|extra/],
    ];
    for (const [input, message] of cases) {
      assert.throws(
        () => validateProfile(input, 'p.json'),
        (err: unknown) => isProfileError(err) && message.test((err as Error).message),
      );
    }
  });

  it('stops start-up with exit 1 when a profile is bad', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-profiles-'));
    for (const f of fs.readdirSync(PROFILES_DIR))
      fs.copyFileSync(path.join(PROFILES_DIR, f), path.join(dir, f));
    fs.writeFileSync(path.join(dir, 'broken.json'), JSON.stringify({ ...GOOD, name: 'broken', deny: {} }));
    const res = await runCli(['serve'], {
      COUNTERSIGN_DATA_DIR: fs.mkdtempSync(path.join(os.tmpdir(), 'cs-data-')),
      COUNTERSIGN_PROFILES_DIR: dir,
      COUNTERSIGN_PORT: '0',
    });
    assert.equal(res.code, 1);
    assert.match(
      res.stderr,
      /profile error: .*broken\.json: facet "send" is named neither in allow nor in deny/,
    );
  });
});

describe('the sliding-minute estimate', () => {
  it('says when the previous minute has slid far enough, or when the next one starts', () => {
    // 3 last minute, none now, weight 0.5: one more fits from weight (3 - 1) / 3 = 2/3 on, so at once;
    // the answer never goes below 1 s.
    assert.equal(retryAfterSeconds(0, 3, 0.5, 3), 1);
    // 6 last minute, 0 now, weight 0.9: one more fits at weight (3 - 1) / 6 = 1/3, 34 s from now.
    assert.equal(retryAfterSeconds(0, 6, 0.9, 3), 34);
    // The current minute alone is full with 20 s left: the next minute weighs it from 1 down to 2/3.
    assert.equal(retryAfterSeconds(3, 0, 20 / 60, 3), 40);
  });
});

for (const kind of databaseKinds()) {
  describe(`policy on ${kind}`, () => {
    let server: TestServer;
    const clients: Client[] = [];
    const agentWith = async (name: string, opts: { profile?: string; rate_limit_per_min?: number } = {}) => {
      const { token } = await createAgent(server.sql, { name, ...opts });
      const client = await connectHttp(server.url, token);
      clients.push(client);
      return client;
    };

    before(async () => {
      server = await startTestServer(kind);
    });
    after(async () => {
      await Promise.allSettled(clients.map((c) => c.close()));
      await server?.stop();
    });

    it("shows each shipped profile's tools and nothing else", async () => {
      const all = builtinTools.map((t) => `isphere_${t.name}`);
      const names = async (c: Client) => (await c.listTools()).tools.map((t) => t.name);
      assert.deepEqual(await names(await agentWith('p-all', { profile: 'all' })), all);
      assert.deepEqual(await names(await agentWith('p-drafting', { profile: 'drafting' })), all);
      assert.deepEqual(
        await names(await agentWith('p-readonly', { profile: 'readonly' })),
        all.filter((n) => !['isphere_send_message', 'isphere_send_file'].includes(n)),
      );
    });

    it('answers TOOL_DENIED with the deny reason for a denied tool, and audits it', async () => {
      const reader = await agentWith('denied-reader', { profile: 'readonly' });
      await assert.rejects(
        reader.callTool({
          name: 'isphere_send_message',
          arguments: { target_type: 'contact', target_id: 'ct_alice', content_text: 'hi' },
        }),
        (err: unknown) => {
          assert.ok(err instanceof ProtocolError);
          // SDK v2 sends a handler's -32002 as -32602 (the 2026-07-28 revision reserves -32002).
          assert.equal(err.code, -32602);
          assert.equal((err.data as { code?: string }).code, 'TOOL_DENIED');
          assert.match(err.message, /sending messages and files is not part of its role/);
          return true;
        },
      );
      const row = await server
        .sql('audit_events')
        .where({ kind: 'auth.denied', tool: 'isphere_send_message' })
        .first();
      assert.equal(row.error_code, 'TOOL_DENIED');
    });

    it('lets a drafting agent dry-run but answers DRY_RUN_ONLY to a real execution', async () => {
      const drafter = await agentWith('drafter', { profile: 'drafting' });
      const args = { target_type: 'contact', target_id: 'ct_alice', content_text: 'draft only' };
      const draft = await call(drafter, 'isphere_send_message', args);
      assert.equal(draft.send_status, 'planned');
      const real = await call(drafter, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: '00000000-0000-4000-8000-000000000000',
      });
      assert.equal(real.error.code, 'DRY_RUN_ONLY');
    });

    it('changes a profile with agent set, refusing unknown profiles', async () => {
      await createAgent(server.sql, { name: 'switcher' });
      const ok = await runCli(['agent', 'set', 'switcher', '--profile', 'readonly'], server.env);
      assert.equal(ok.code, 0, ok.stderr);
      assert.equal((await server.sql('agents').where({ name: 'switcher' }).first()).profile, 'readonly');
      const bad = await runCli(['agent', 'set', 'switcher', '--profile', 'nonesuch'], server.env);
      assert.equal(bad.code, 2, 'a usage error');
      assert.match(bad.stderr, /--profile/);
      assert.match(bad.stderr, /installed: all, drafting, readonly/);
    });

    it('rate-limits per agent across its sessions, with retry_after_s', async () => {
      const { token } = await createAgent(server.sql, { name: 'chatty', rate_limit_per_min: 3 });
      const one = await connectHttp(server.url, token);
      const two = await connectHttp(server.url, token);
      clients.push(one, two);
      const results = [];
      for (const c of [one, two, one, two])
        results.push(await call(c, 'isphere_search_groups', { query: 'board' }));
      assert.deepEqual(
        results.map((r) => r.ok),
        [true, true, true, false],
      );
      const limited = results[3]!;
      assert.equal(limited.error.code, 'RATE_LIMITED');
      // At most the rest of this minute plus the part of the next one in which these calls still weigh.
      assert.ok(limited.error.retry_after_s >= 1 && limited.error.retry_after_s <= 80);
      const health = (await (await fetch(new URL('/healthz', server.url))).json()) as {
        rate_limited_calls: number;
      };
      assert.ok(health.rate_limited_calls >= 1);
    });

    it('answers an agent that calls on past its limit at its pace: a burst of 10, then 10 a second', async () => {
      const { token } = await createAgent(server.sql, { name: 'insistent', rate_limit_per_min: 1 });
      const c = await connectHttp(server.url, token);
      clients.push(c);
      assert.equal((await call(c, 'isphere_search_groups', { query: 'board' })).ok, true);
      const started = performance.now();
      const codes: unknown[] = [];
      for (let i = 0; i < 25; i++)
        codes.push((await call(c, 'isphere_search_groups', { query: 'board' })).error?.code);
      const took = performance.now() - started;
      assert.ok(
        codes.every((code) => code === 'RATE_LIMITED'),
        codes.join(' '),
      );
      // policy.rate_limited_per_second (10): the first ten at once, then one every 100 ms, so the 25th
      // no sooner than 1.5 s after the first (a loaded machine is only later).
      assert.ok(took >= 1400, `${Math.round(took)} ms for 25 refusals`);
    });

    it(`counts an agent's calls at the default 60 a minute ${kind === 'pglite' ? 'in memory, without a statement each' : 'in the database every replica shares'}`, async () => {
      const c = await agentWith('default-limit', { rate_limit_per_min: 60 });
      let counted = 0;
      const count = (q: { sql?: string }) => (counted += q.sql?.includes('rate_windows') ? 1 : 0);
      server.sql.on('query', count);
      try {
        for (let i = 0; i < 5; i++)
          assert.equal((await call(c, 'isphere_search_groups', { query: 'board' })).ok, true);
      } finally {
        server.sql.off('query', count);
      }
      // The embedded database is this process's alone; PostgreSQL's replicas share one count.
      assert.equal(counted, kind === 'pglite' ? 0 : 5);
    });

    it("counts an agent's racing calls exactly, in the database every replica shares", async () => {
      const limiter = createRateLimiter(server.sql);
      const { agent } = await createAgent(server.sql, { name: 'racer' });
      const waits = await Promise.all(Array.from({ length: 20 }, () => limiter.take(agent.id, 7)));
      assert.equal(waits.filter((w) => w === 0).length, 7);
      assert.ok(waits.filter((w) => w > 0).every((w) => w >= 1 && w <= 120));
      assert.equal(await limiter.take(randomUUID(), 7), 0, 'per agent');
    });

    it('refuses an agent past its limit without a statement each, until a call would fit', async () => {
      const limiter = createRateLimiter(server.sql);
      const { agent } = await createAgent(server.sql, { name: 'past-its-limit' });
      for (let i = 0; i < 3; i++) assert.equal(await limiter.take(agent.id, 3), 0);
      let queries = 0;
      const count = () => queries++;
      server.sql.on('query', count);
      const waits: number[] = [];
      for (let i = 0; i < 50; i++) waits.push(await limiter.take(agent.id, 3));
      server.sql.off('query', count);
      assert.ok(
        waits.every((w) => w >= 1 && w <= 120),
        `waits ${waits.join(' ')}`,
      );
      assert.equal(queries, 1, 'the first refusal asks the database; the rest are refused from its answer');
      // Another replica asks for itself, and is refused by the same count.
      assert.ok((await createRateLimiter(server.sql).take(agent.id, 3)) >= 1);
      // A raised limit is a new question.
      assert.equal(await limiter.take(agent.id, 100), 0);
    });

    it('takes calls from the database in leases when the limit is high, never exceeding it', async () => {
      // Two limiters stand for two replicas; 1000 a minute is taken 10 at a time.
      const replicas = [createRateLimiter(server.sql), createRateLimiter(server.sql)];
      const { agent } = await createAgent(server.sql, { name: 'busy' });
      // The limit holds for a sliding minute by the usual estimate (the previous minute's count weighted
      // by what the window still covers), which lets a burst that straddles the turn of a minute through
      // a few calls over. The burst below takes well under a second: it starts in a minute with more than
      // ten seconds left, by the database's clock, which the limiter counts in.
      const { rows } = (await server.sql.raw(
        'select extract(epoch from clock_timestamp())::float8 as e',
      )) as { rows: { e: number }[] };
      const left = 60 - (rows[0]!.e % 60);
      if (left < 10) await new Promise((resolve) => setTimeout(resolve, left * 1000 + 100));
      let queries = 0;
      const count = () => queries++;
      server.sql.on('query', count);
      const waits = await Promise.all(
        Array.from({ length: 1200 }, (_, i) => replicas[i % 2]!.take(agent.id, 1000)),
      );
      server.sql.off('query', count);
      const admitted = waits.filter((w) => w === 0).length;
      assert.ok(admitted <= 1000, `admitted ${admitted}`);
      // Unused leases are held by at most the two replicas: 10 calls each.
      assert.ok(admitted >= 1000 - 2 * 10, `admitted ${admitted}`);
      assert.ok(queries < 400, `${queries} queries for 1200 calls`);
    });

    it('reports health and Prometheus metrics', async () => {
      const res = await fetch(new URL('/healthz', server.url));
      assert.equal(res.status, 200);
      const health = (await res.json()) as Record<string, unknown>;
      for (const key of [
        'status',
        'version',
        'uptime_s',
        'database',
        'calls',
        'errors',
        'overrun_calls',
        'rate_limited_calls',
        'pending_approvals',
        'audit_head_seq',
      ]) {
        assert.ok(key in health, key);
      }
      assert.equal(health.status, 'ok');
      assert.deepEqual((health.database as { reachable: boolean }).reachable, true);
      assert.ok((health.calls as number) > 5);
      assert.ok((health.pending_approvals as number) >= 1);
      const metrics = await (await fetch(new URL('/metrics', server.url))).text();
      assert.match(
        metrics,
        /countersign_tool_calls_total\{tool="isphere_search_groups",result="ok",error_code=""\} \d+/,
      );
      assert.match(
        metrics,
        /countersign_tool_call_seconds_bucket\{le="0.005",tool="isphere_search_groups"\}/,
      );
      assert.match(metrics, /countersign_rate_limited_total \d+/);
    });
  });
}

for (const kind of databaseKinds()) {
  describe(`the call deadline on ${kind}`, () => {
    let server: TestServer;
    let client: Client;
    before(async () => {
      server = await startTestServer(
        kind,
        { COUNTERSIGN_CALL_TIMEOUT_MS: '150' },
        { faults: slowHandlers(400) },
      );
      client = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await client?.close();
      await server?.stop();
    });

    it('answers -32001 CALL_TIMEOUT, counts the overrun and discards the late result', async () => {
      await assert.rejects(
        client.callTool({ name: 'isphere_search_groups', arguments: { query: 'board' } }),
        (err: unknown) => {
          assert.ok(err instanceof ProtocolError);
          assert.equal(err.code, -32001);
          assert.equal((err.data as { code: string }).code, 'CALL_TIMEOUT');
          return true;
        },
      );
      // The handler goes on after the answer; its result is discarded when it finishes.
      const health = await waitFor('the late result to be discarded', async () => {
        const res = await fetch(new URL('/healthz', server.url));
        const body = (await res.json()) as { overrun_calls: number; late_results_discarded: number };
        return body.late_results_discarded > 0 ? body : undefined;
      });
      assert.equal(health.overrun_calls, 1);
      assert.equal(health.late_results_discarded, 1);
      const row = await server.sql('audit_events').where({ error_code: 'CALL_TIMEOUT' }).first();
      assert.ok(row, 'the overrun is audited');
    });
  });
}
