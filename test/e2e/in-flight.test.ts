import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import { createAgent } from '../../src/accounts/agents.ts';
import { loadConfig } from '../../src/config.ts';
import { createInFlight } from '../../src/server/in-flight.ts';
import { databaseKinds } from '../helpers/db.ts';
import { connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const pending = new Promise<void>(() => undefined);
const never = () => pending;

describe('an agent’s turns on one replica', () => {
  it('lets max requests in at once and the next in arrival order, one as each leaves', async () => {
    const turns = createInFlight(2, 10);
    const a = await turns.enter('agent', never);
    const b = await turns.enter('agent', never);
    assert.ok(a && b);
    const order: string[] = [];
    const c = turns.enter('agent', never).then((leave) => (order.push('c'), leave));
    const d = turns.enter('agent', never).then((leave) => (order.push('d'), leave));
    assert.deepEqual(turns.count('agent'), { active: 2, waiting: 2 });
    // Another agent is not kept waiting by this one.
    assert.ok(await turns.enter('other', never));
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(order, []);
    a();
    a(); // leaving twice frees one turn only
    const leaveC = await c;
    assert.deepEqual(order, ['c']);
    assert.deepEqual(turns.count('agent'), { active: 2, waiting: 1 });
    b();
    (await d)!();
    leaveC!();
    assert.deepEqual(turns.count('agent'), { active: 0, waiting: 0 });
  });

  it('refuses at once past maxWaiting, and a request that ends while it waits gives up its place', async () => {
    const turns = createInFlight(1, 1);
    const first = await turns.enter('agent', never);
    let end!: () => void;
    const gone = new Promise<void>((resolve) => (end = resolve));
    const waiting = turns.enter('agent', () => gone);
    assert.equal(await turns.enter('agent', never), undefined, 'one already waits');
    end();
    assert.equal(await waiting, undefined);
    assert.deepEqual(turns.count('agent'), { active: 1, waiting: 0 });
    const next = turns.enter('agent', never);
    first!();
    assert.ok(await next);
  });

  it('http.max_calls_in_flight_per_agent defaults to 4 and the waiting bound to 1000; both have an environment form', () => {
    const defaults = loadConfig({}, '/tmp/none').http;
    assert.equal(defaults.max_calls_in_flight_per_agent, 4);
    assert.equal(defaults.max_calls_waiting_per_agent, 1000);
    const set = loadConfig(
      { COUNTERSIGN_MAX_CALLS_IN_FLIGHT_PER_AGENT: '2', COUNTERSIGN_MAX_CALLS_WAITING_PER_AGENT: '5' },
      '/tmp/none',
    ).http;
    assert.equal(set.max_calls_in_flight_per_agent, 2);
    assert.equal(set.max_calls_waiting_per_agent, 5);
  });
});

const INITIALIZE = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '1' } },
});

/** A POST to /mcp whose body is sent in two halves, the second when `finish` is called. */
function halfSent(url: string, token: string) {
  const target = new URL('/mcp', url);
  let finish!: () => void;
  const answered = new Promise<number>((resolve, reject) => {
    const req = http.request(
      target,
      {
        method: 'POST',
        headers: {
          Authorization: `Bearer ${token}`,
          'Content-Type': 'application/json',
          Accept: 'application/json, text/event-stream',
          'Content-Length': Buffer.byteLength(INITIALIZE),
        },
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode!));
      },
    );
    req.on('error', reject);
    req.write(INITIALIZE.slice(0, 20));
    finish = () => req.end(INITIALIZE.slice(20));
  });
  return { answered, finish: () => finish() };
}

const post = (url: string, token: string) =>
  fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${token}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
    },
    body: INITIALIZE,
  });

for (const kind of databaseKinds()) {
  describe(`one agent's requests take turns, another's do not wait (${kind})`, () => {
    let server: TestServer;
    let other: string;
    before(async () => {
      server = await startTestServer(kind, {
        COUNTERSIGN_MAX_CALLS_IN_FLIGHT_PER_AGENT: '1',
        COUNTERSIGN_MAX_CALLS_WAITING_PER_AGENT: '1',
      });
      other = (await createAgent(server.sql, { name: 'other-agent' })).token;
    });
    after(async () => {
      await server?.stop();
    });

    it('keeps the next request unread until the one in flight is answered, refuses one more with 429', async () => {
      const first = halfSent(server.url, server.demoToken);
      const order: string[] = [];
      // Its body half sent, the first holds the agent's one turn; the second waits for it.
      await new Promise((r) => setTimeout(r, 300));
      const second = post(server.url, server.demoToken).then((res) => (order.push('second'), res));
      await new Promise((r) => setTimeout(r, 300));
      const third = await post(server.url, server.demoToken);
      assert.equal(third.status, 429);
      assert.equal(third.headers.get('retry-after'), '1');
      const problem = (await third.json()) as { code: string; reason: string };
      assert.equal(problem.code, 'RATE_LIMITED');
      assert.equal(problem.reason, 'too_many_in_flight');
      // Another agent is answered meanwhile.
      const theirs = await post(server.url, other);
      assert.equal(theirs.status, 200);
      await theirs.body?.cancel();
      assert.deepEqual(order, [], 'the second waits for the first');

      first.finish();
      assert.equal(await first.answered, 200);
      const answered = await second;
      assert.equal(answered.status, 200);
      await answered.body?.cancel();
    });

    it('holds no turn for an open listen stream', async () => {
      const client = await connectHttp(server.url, server.demoToken, 'modern');
      try {
        const subscription = await client.listen({ toolsListChanged: true });
        const res = await post(server.url, server.demoToken);
        assert.equal(res.status, 200);
        await res.body?.cancel();
        await subscription.close();
      } finally {
        await client.close();
      }
    });
  });
}
