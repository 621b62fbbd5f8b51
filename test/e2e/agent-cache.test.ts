import assert from 'node:assert/strict';
import net, { type AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, it } from 'node:test';
import { runAdminCommand, type AdminDeps } from '../../src/admin/commands.ts';
import { createAgent } from '../../src/accounts/agents.ts';
import { adminDeps } from '../../src/app/admin-deps.ts';
import { createPgBus, type ClusterBus } from '../../src/cluster/bus.ts';
import { loadConfig } from '../../src/config.ts';
import { createBlobStore } from '../../src/connectors/local/blobs.ts';
import type { Database } from '../../src/db/knex.ts';
import { createLogger } from '../../src/log.ts';
import { createAgentAuth, type Authenticate } from '../../src/accounts/agent-cache.ts';
import { describeOnPostgres, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/server.ts';

/**
 * A TCP proxy to PostgreSQL that, once `hold()` is called, keeps what the server sends until `release()`:
 * the listening connection of a bus behind it hears every notification late, as on a slow network.
 */
async function holdingProxy(target: URL) {
  let holding = false;
  const held: { socket: net.Socket; chunk: Buffer }[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    sockets.add(client).add(upstream);
    client.pipe(upstream);
    upstream.on('data', (chunk: Buffer) => {
      if (holding) held.push({ socket: client, chunk });
      else client.write(chunk);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(target.href);
  url.host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url: url.href,
    hold: () => void (holding = true),
    release() {
      holding = false;
      for (const { socket, chunk } of held.splice(0)) socket.write(chunk);
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

describeOnPostgres('an agent change made on this replica holds here at once', () => {
  let testDb: TestDatabase;
  let db: Database;
  let proxy: Awaited<ReturnType<typeof holdingProxy>>;
  let bus: ClusterBus;
  let auth: Authenticate;
  let deps: AdminDeps;

  before(async () => {
    ({ testDb, db } = await openMigratedDatabase('postgres'));
    proxy = await holdingProxy(new URL(testDb.url!));
    bus = await createPgBus(db.knex, proxy.url, createLogger('silent'));
    auth = createAgentAuth(db.knex, bus);
    deps = adminDeps(
      {
        knex: db.knex,
        blobs: createBlobStore(path.join(testDb.dataDir, 'blobs')),
        config: loadConfig({ COUNTERSIGN_DATA_DIR: testDb.dataDir }, testDb.dataDir),
      },
      { agentChanged: (id) => bus.agentChangedHere(id) },
    );
  });
  after(async () => {
    await bus?.close();
    await proxy?.close();
    await db?.close();
    await testDb?.drop();
  });

  /**
   * An agent whose token this replica has cached: authenticated until a call reads nothing (a read that
   * an announcement overtook, such as the new agent's own, is not cached).
   */
  const cachedAgent = async (name: string) => {
    const { token } = await createAgent(db.knex, { name });
    let statements = 0;
    const count = () => statements++;
    db.knex.on('query', count);
    try {
      await waitFor(`${name} to be served from the cache`, async () => {
        const before = statements;
        assert.ok(!('failure' in (await auth(token))));
        return statements === before ? true : undefined;
      });
    } finally {
      db.knex.off('query', count);
    }
    return token;
  };
  const refusal = async (token: string) => {
    const res = await auth(token);
    return 'failure' in res ? res.failure : undefined;
  };

  it('refuses a rotated token, a revoked agent and serves a changed profile before the notification', async () => {
    const rotatedToken = await cachedAgent('rotor');
    const revokedToken = await cachedAgent('gone');
    const changedToken = await cachedAgent('changed');
    proxy.hold();
    try {
      await runAdminCommand(deps, { command: 'agent.rotate', name: 'rotor', actor: 'test' });
      assert.equal(await refusal(rotatedToken), 'unknown_token');
      await runAdminCommand(deps, { command: 'agent.revoke', name: 'gone', actor: 'test' });
      assert.equal(await refusal(revokedToken), 'revoked_token');
      await runAdminCommand(deps, {
        command: 'agent.set',
        name: 'changed',
        profile: 'readonly',
        actor: 'test',
      });
      const changed = await auth(changedToken);
      assert.ok(!('failure' in changed));
      assert.equal(changed.agent.profile, 'readonly');
    } finally {
      proxy.release();
    }
  });

  it('without word from its own command, this replica serves the cache until the notification comes', async () => {
    const token = await cachedAgent('elsewhere');
    proxy.hold();
    try {
      // The same command, run as another process would run it: nothing tells this replica but PostgreSQL.
      await runAdminCommand(
        { ...deps, agentChanged: undefined },
        {
          command: 'agent.revoke',
          name: 'elsewhere',
          actor: 'test',
        },
      );
      assert.equal(await refusal(token), undefined, 'the held notification has not reached the cache');
    } finally {
      proxy.release();
    }
    await waitFor('the notification to drop the entry', async () =>
      (await refusal(token)) === 'revoked_token' ? true : undefined,
    );
  });
});
