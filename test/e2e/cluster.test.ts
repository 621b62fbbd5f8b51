import { lazyHostRoots } from '../../src/db/host-roots.ts';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, it } from 'node:test';
import { ProtocolError, SdkHttpError, type Client } from '@modelcontextprotocol/client';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { createPgBus } from '../../src/cluster/bus.ts';
import { openDatabase, type Database } from '../../src/db/knex.ts';
import { createLogger } from '../../src/log.ts';
import { createAgentAuth } from '../../src/accounts/agent-cache.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { startBalancer, type Balancer } from '../helpers/balancer.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, ERAS, testEnv, waitFor, type Envelope, type Era } from '../helpers/server.ts';
import { startUpstreamFixture, type UpstreamFixture } from '../helpers/upstream-fixture.ts';

const REPLICAS = 3;
const tokenOf = (stdout: string) => stdout.trim().split('\n').at(-1)!;

/** The JSON-RPC code of a refused call, or 'answered' when the call was answered with a result. */
async function rpcCode(p: Promise<unknown>): Promise<number | 'answered'> {
  try {
    await p;
    return 'answered';
  } catch (err) {
    if (err instanceof ProtocolError) return err.code;
    throw err;
  }
}

// Several processes can share only PostgreSQL; the embedded database allows one process.
describeOnPostgres(
  `${REPLICAS} replicas on one PostgreSQL behind a round-robin balancer, no affinity`,
  () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    let direct: Database;
    let crm: UpstreamFixture;
    let workDir: string;
    let replicas: Awaited<ReturnType<typeof spawnServer>>[] = [];
    let balancer: Balancer;
    const clients: Client[] = [];
    const cli = async (args: string[], extra: Record<string, string> = {}) => {
      const res = await runCli(args, { ...env, ...extra });
      assert.equal(res.code, 0, res.stderr);
      return res.stdout;
    };
    const agent = async (name: string, era: Era, opts: string[] = []) => {
      const token = tokenOf(await cli(['agent', 'add', name, ...opts]));
      const client = await connectHttp(balancer.url, token, era);
      clients.push(client);
      return { token, client };
    };

    before(async () => {
      db = await createTestDatabase('postgres');
      workDir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-cluster-'));
      crm = await startUpstreamFixture();
      const configFile = path.join(workDir, 'config.json');
      fs.writeFileSync(configFile, JSON.stringify({ upstreams: [{ name: 'crm', url: crm.url }] }));
      env = testEnv(db, { COUNTERSIGN_DEMO: 'false', COUNTERSIGN_CONFIG: configFile });
      await cli(['demo']);
      const chair = await runCli(['user', 'add', 'chair-cy', '--role', 'chair'], env, {
        input: 'cluster chair pw\n',
      });
      assert.equal(chair.code, 0, chair.stderr);
      // One data directory for all: the replicas share the signing key in it (the cluster checks that).
      replicas = await Promise.all(Array.from({ length: REPLICAS }, () => spawnServer(env)));
      balancer = await startBalancer(replicas.map((r) => r.url));
      direct = await openDatabase({ url: db.url, pgliteDir: '', command: 'test' });
    });
    after(async () => {
      await Promise.allSettled(clients.map((c) => c.close()));
      await balancer?.close();
      await Promise.allSettled(replicas.map((r) => stopChild(r.child)));
      await crm?.close();
      await direct?.close();
      await db?.drop();
      fs.rmSync(workDir, { recursive: true, force: true });
    });

    for (const era of ERAS) {
      it(`connects, lists and reads through the balancer (${era} client)`, async () => {
        const before = [...balancer.hits.values()];
        const { client } = await agent(`reader-${era}`, era);
        assert.equal(client.getProtocolEra(), era);
        for (let i = 0; i < REPLICAS; i++) {
          const names = (await client.listTools()).tools.map((t) => t.name);
          assert.ok(names.includes('isphere_send_message') && names.includes('crm__set_note'));
          const found = await call(client, 'isphere_search_contacts', { query: 'a' });
          assert.equal(found.ok, true, JSON.stringify(found.error));
        }
        const after = [...balancer.hits.values()];
        assert.ok(
          after.every((n, i) => n > before[i]!),
          `every replica answered some of the requests: ${after}`,
        );
      });
    }

    it('one approval, 10 executions racing over the replicas: exactly one message sent', async () => {
      const legacy = await agent('racer', 'legacy');
      const modern = await connectHttp(balancer.url, legacy.token, 'modern');
      clients.push(modern);
      const args = { target_type: 'group', target_id: 'gr_board', content_text: 'Once, whichever replica.' };
      const draft = await call(legacy.client, 'isphere_send_message', args);
      const approvalId = await approveAsChair({ env, name: 'chair-cy', password: 'cluster chair pw' }, draft);
      const results = await Promise.all(
        Array.from({ length: 10 }, (_, i) =>
          call(i % 2 ? modern : legacy.client, 'isphere_send_message', {
            ...args,
            dry_run: false,
            approval_id: approvalId,
          }),
        ),
      );
      const sent = results.filter((r: Envelope) => r.ok);
      assert.equal(sent.length, 1);
      assert.equal(sent[0]!.send_status, 'sent');
      const refused = results.filter((r: Envelope) => !r.ok);
      assert.deepEqual(
        refused.map((r: Envelope) => `${r.error.code}/${r.error.reason}`),
        Array(9).fill('APPROVAL_REQUIRED/consumed'),
      );
      assert.equal((await direct.knex('messages').where({ content_text: args.content_text })).length, 1);
    });

    it('a profile change, then a revocation, take effect at the next call on every replica', async () => {
      const { client } = await agent('changeling', 'modern');
      const modern = client;
      const legacy = (await agent('changeling-2', 'legacy')).client;
      const write = (c: Client) =>
        c.callTool({
          name: 'isphere_send_message',
          arguments: { target_type: 'contact', target_id: 'ct_alice', content_text: 'draft' },
        });
      // Every replica has seen (and may cache) both agents before the change.
      for (let i = 0; i < REPLICAS; i++) {
        assert.equal(await rpcCode(write(modern)), 'answered');
        assert.equal(await rpcCode(write(legacy)), 'answered');
      }
      await cli(['agent', 'set', 'changeling', '--profile', 'readonly']);
      await cli(['agent', 'set', 'changeling-2', '--profile', 'readonly']);
      for (let i = 0; i < REPLICAS; i++) {
        // SDK v2 answers a handler's -32002 as -32602 (the 2026-07-28 revision reserves -32002);
        // data.code still says TOOL_DENIED, and the audit row too.
        for (const c of [modern, legacy]) {
          await assert.rejects(write(c), (err: unknown) => {
            assert.ok(err instanceof ProtocolError);
            assert.equal(err.code, -32602);
            assert.equal((err.data as { code?: string }).code, 'TOOL_DENIED');
            return true;
          });
        }
      }
      await cli(['agent', 'revoke', 'changeling']);
      for (let i = 0; i < REPLICAS; i++) {
        await assert.rejects(modern.listTools(), (err: unknown) => {
          assert.ok(err instanceof SdkHttpError, String(err));
          assert.equal(err.status, 401);
          return true;
        });
      }
      const revoked = await direct
        .knex('audit_events')
        .where({ kind: 'auth.denied', error_code: 'UNAUTHENTICATED' })
        .whereRaw(`details->>'reason' = 'revoked_token'`);
      assert.equal(revoked.length, REPLICAS);
    });

    it('a limit of 30 calls a minute counts the calls on all replicas together', async () => {
      const { client } = await agent('limited', 'legacy', ['--rate-limit', '30']);
      const outcomes: string[] = [];
      for (let i = 0; i < 32; i++) {
        const res = await call(client, 'isphere_search_groups', { query: 'board' });
        outcomes.push(res.ok ? 'ok' : res.error.code);
      }
      assert.deepEqual(outcomes.slice(0, 30), Array(30).fill('ok'));
      assert.ok(outcomes.slice(30).includes('RATE_LIMITED'), `calls 31 and 32: ${outcomes.slice(30)}`);
    });

    it("an upstream's tool-list change heard by one replica reaches listeners on every replica", async () => {
      const token = tokenOf(await cli(['agent', 'add', 'listener']));
      const heard: number[] = Array(REPLICAS).fill(0);
      const listeners = await Promise.all(replicas.map((r) => connectHttp(r.url, token, 'modern')));
      clients.push(...listeners);
      for (const [i, c] of listeners.entries()) {
        c.setNotificationHandler('notifications/tools/list_changed', async () => void heard[i]!++);
        const sub = await c.listen({ toolsListChanged: true });
        assert.deepEqual(sub.honoredFilter, { toolsListChanged: true });
      }
      // Only the first replica's upstream session is told; the others hear it over the cluster's bus.
      crm.reshape({ notify: 'first' });
      await waitFor('every listener to hear of the change', async () =>
        heard.every((n) => n > 0) ? true : undefined,
      );
      // And every replica lists the new schema (the others listed their upstream again).
      const via = await connectHttp(balancer.url, token, 'legacy');
      clients.push(via);
      await waitFor('every replica to list the new schema', async () => {
        const seen = [];
        for (let i = 0; i < REPLICAS; i++) {
          const tool = (await via.listTools()).tools.find((t) => t.name === 'crm__set_note');
          seen.push(Boolean(tool?.inputSchema.properties?.priority));
        }
        return seen.every(Boolean) ? true : undefined;
      });
    });

    it('caches an agent per replica only while PostgreSQL announces its changes', async () => {
      const log = createLogger('silent');
      const own = await openDatabase({ url: db.url, pgliteDir: '', command: 'test' });
      const bus = await createPgBus(own.knex, db.url!, log);
      let queries = 0;
      own.knex.on('query', () => queries++);
      try {
        // The replicas' shared host roots file, as a fourth process on this host would read it.
        const roots = lazyHostRoots(own.knex, env.COUNTERSIGN_HOST_ROOTS!);
        const auth = createAgentAuth(own.knex, bus, roots);
        const token = tokenOf(await cli(['agent', 'add', 'cached']));
        const profileNow = async () => {
          const res = await auth(token);
          assert.ok(!('failure' in res));
          return res.agent.profile;
        };
        assert.equal(await profileNow(), 'all'); // the agent's row, and the token tag's key once
        const first = queries;
        assert.equal(await profileNow(), 'all');
        assert.equal(queries, first, 'the second call was answered from the cache');
        // Changed behind the cache's back, by another process: the trigger's NOTIFY drops the entry.
        await cli(['agent', 'set', 'cached', '--profile', 'drafting']);
        await waitFor('the change to be announced', async () =>
          (await profileNow()) === 'drafting' ? true : undefined,
        );
        // Without a listening connection nothing is served from the cache.
        await bus.close();
        assert.equal(bus.listening(), false);
        // (Changed by a command: a profile set by SQL alone is not sealed, and refuses the agent.)
        await cli(['agent', 'set', 'cached', '--profile', 'readonly']);
        assert.equal(await profileNow(), 'readonly');
      } finally {
        await bus.close();
        await own.close();
      }
    });

    it('leaves one verifiable chain, written by all replicas', async () => {
      const report = await verifyDatabaseChain(direct.knex);
      assert.equal(report.first_bad, undefined);
      assert.ok(report.rows > 50);
    });

    it('refuses to start a replica that holds another signing key, naming audit.signing_key_path', async () => {
      const other = path.join(workDir, 'other-key.pem');
      const { privateKey } = generateKeyPairSync('ed25519');
      fs.writeFileSync(other, privateKey.export({ format: 'pem', type: 'pkcs8' }), { mode: 0o600 });
      await assert.rejects(
        spawnServer({ ...env, COUNTERSIGN_AUDIT_SIGNING_KEY: other }),
        /exited with 1: [\s\S]*another audit signing key[\s\S]*audit\.signing_key_path/,
      );
    });

    it('runs periodic work on one leader; when it dies, another replica takes over', async () => {
      const leads = (r: (typeof replicas)[number]) => /leads the cluster/.test(r.stderr());
      const leader = await waitFor('a leader', async () => {
        const found = replicas.filter(leads);
        return found.length > 0 ? found : undefined;
      });
      assert.equal(leader.length, 1, 'exactly one replica leads');
      leader[0]!.child.kill('SIGKILL');
      const next = await waitFor('another leader', async () =>
        replicas.find((r) => r !== leader[0] && leads(r)),
      );
      assert.ok(next);
    });
  },
);
