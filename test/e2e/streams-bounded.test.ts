import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { loadConfig } from '../../src/config.ts';
import { fetchUnwarned } from '../../src/core/fetch.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { newClient, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

/** A 2026-07-28 client whose listen requests' HTTP answers are kept (status and body). */
async function listener(url: string, token: string) {
  const answers: { status: number; type: string | null; body: string }[] = [];
  const client: Client = newClient('modern');
  await client.connect(
    new StreamableHTTPClientTransport(new URL('/mcp', url), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
      fetch: async (input, init) => {
        const res = await fetchUnwarned(input, init);
        if (typeof init?.body === 'string' && init.body.includes('"subscriptions/listen"') && !res.ok) {
          answers.push({
            status: res.status,
            type: res.headers.get('content-type'),
            body: await res.clone().text(),
          });
        }
        return res;
      },
    }),
  );
  return { client, answers };
}

it('http.max_streams_per_agent defaults to 8 and has an environment form', () => {
  assert.equal(loadConfig({}, '/tmp/none').http.max_streams_per_agent, 8);
  const set = loadConfig({ COUNTERSIGN_MAX_STREAMS_PER_AGENT: '3' }, '/tmp/none');
  assert.equal(set.http.max_streams_per_agent, 3);
});

for (const kind of databaseKinds()) {
  describe(`listen streams are bounded (${kind})`, () => {
    let server: TestServer;
    const clients: Client[] = [];
    before(async () => {
      server = await startTestServer(kind);
    });
    after(async () => {
      await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
      await server.stop();
    });

    async function openStreams(token: string, n: number, url = server.url) {
      const subs = [];
      for (let i = 0; i < n; i++) {
        const { client } = await listener(url, token);
        clients.push(client);
        subs.push(await client.listen({ toolsListChanged: true }));
      }
      return subs;
    }

    it('an agent holds at most 8 streams: the 9th is refused with a problem document', async () => {
      const token = await server.addAgent('streamer');
      const subs = await openStreams(token, 8);
      const ninth = await listener(server.url, token);
      clients.push(ninth.client);
      await assert.rejects(ninth.client.listen({ toolsListChanged: true }));
      assert.equal(ninth.answers.length, 1);
      const [answer] = ninth.answers;
      assert.equal(answer!.status, 429);
      assert.match(answer!.type ?? '', /^application\/problem\+json/);
      const problem = JSON.parse(answer!.body) as { code: string; reason: string; status: number };
      assert.equal(problem.code, 'RATE_LIMITED');
      assert.equal(problem.reason, 'too_many_streams');
      assert.equal(problem.status, 429);

      // Another agent is not affected; and once a stream closes, its place is free again.
      const other = await openStreams(await server.addAgent('bystander'), 1);
      await other[0]!.close();
      await subs[0]!.close();
      await waitFor('the closed stream to free its place', async () => {
        const again = await listener(server.url, token);
        clients.push(again.client);
        return again.client.listen({ toolsListChanged: true }).then(
          (sub) => sub,
          () => undefined,
        );
      });
      await Promise.all(subs.slice(1).map((s) => s.close()));
    });

    for (const change of ['revoke', 'rotate'] as const) {
      it(`closes an agent's open streams when it is ${change === 'revoke' ? 'revoked' : 'rotated'} by the CLI`, async () => {
        const name = `${change}d-streamer`;
        const token = await server.addAgent(name);
        const bystander = (await openStreams(await server.addAgent(`${change}-bystander`), 1))[0]!;
        const subs = await openStreams(token, 2);
        const result = await runCli(['agent', change, name], server.env);
        assert.equal(result.code, 0, result.stderr);
        for (const sub of subs) assert.equal(await sub.closed, 'remote');
        // The other agent's stream stays open.
        const stillOpen = await Promise.race([
          bystander.closed.then(() => false),
          new Promise<boolean>((resolve) => setTimeout(() => resolve(true), 300)),
        ]);
        assert.equal(stillOpen, true);
        await bystander.close();
      });
    }

    // Two processes share one database only on PostgreSQL: the CLI's change reaches each replica
    // through the trigger on agents, and each closes the streams it holds.
    if (kind === 'postgres')
      it("closes an agent's streams on every replica when it is revoked", async () => {
        const name = 'replicated-streamer';
        const token = await server.addAgent(name);
        const replica = await spawnServer(server.env);
        try {
          const subs = [...(await openStreams(token, 2)), ...(await openStreams(token, 2, replica.url))];
          const result = await runCli(['agent', 'revoke', name], server.env);
          assert.equal(result.code, 0, result.stderr);
          for (const sub of subs) assert.equal(await sub.closed, 'remote');
        } finally {
          await stopChild(replica.child);
        }
      });
  });
}
