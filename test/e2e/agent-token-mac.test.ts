import assert from 'node:assert/strict';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { newTaggedToken } from '../../src/accounts/token-tag.ts';
import { runAdminCommand } from '../../src/admin/commands.ts';
import { loadConfig } from '../../src/config.ts';
import { createHostRoots, readHostRoots } from '../../src/core/host-roots.ts';
import { openDatabase, type Database } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';
import { sharedValue } from '../../src/db/settings.ts';
import { createLogger } from '../../src/log.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { type SqlServer, startSqlServer, testEnv } from '../helpers/server.ts';

const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
};

/** How the agent's token was stored before tokens were MACs: its plain SHA-256. */
const sha256 = (token: string) => createHash('sha256').update(token).digest('hex');

/** An initialize with `token`: the HTTP status and the problem's reason (undefined on success). */
async function tryToken(url: string, token: string) {
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${token}`,
    },
    body: JSON.stringify(INIT),
  });
  const text = await res.text();
  const reason = res.status === 401 ? (JSON.parse(text) as { reason: string }).reason : undefined;
  return { status: res.status, reason };
}

/**
 * A database as the version before MACs left it: the tag key in server_secrets, and agents whose
 * token_hash is the SHA-256 of a tagged token and of an untagged one. With `rootsFile` the host roots
 * file also exists, as that version made it (without the record of agent tokens).
 */
async function legacyInstall(db: Database, rootsFile: string | undefined) {
  const key = await sharedValue(db.knex, 'agent_token_tag_key', () => randomBytes(32).toString('base64url'));
  const tagged = newTaggedToken(Buffer.from(key, 'base64url'));
  const untagged = `cs_${randomBytes(32).toString('base64url')}`;
  await db.knex('agents').insert([
    { id: randomUUID(), name: 'old-tagged', profile: 'all', token_hash: sha256(tagged), token_tagged: true },
    {
      id: randomUUID(),
      name: 'old-untagged',
      profile: 'all',
      token_hash: sha256(untagged),
      token_tagged: false,
    },
  ]);
  if (rootsFile) {
    createHostRoots(rootsFile, () => `countersign:${randomUUID()}`, {
      agent_token_tag_key: key,
      agent_token_hashes: [],
    });
    const file = JSON.parse(fs.readFileSync(rootsFile, 'utf8')) as Record<string, unknown>;
    delete file.agent_tokens;
    fs.writeFileSync(rootsFile, JSON.stringify(file));
  }
  return { key: Buffer.from(key, 'base64url'), tagged, untagged };
}

for (const kind of databaseKinds()) {
  for (const before40 of [false, true]) {
    const start = before40 ? 'no host roots file yet' : 'a host roots file without the token record';
    describe(`agent tokens as MACs on ${kind}, upgraded from ${start}`, () => {
      let testDb: TestDatabase;
      let db: Database;
      let server: SqlServer;
      let legacy: Awaited<ReturnType<typeof legacyInstall>>;
      let rootsFile: string;

      before(async () => {
        testDb = await createTestDatabase(kind);
        db = await openDatabase({
          url: testDb.url,
          pgliteDir: path.join(testDb.dataDir, 'pglite'),
          command: 'test',
        });
        await migrateLatest(db.knex);
        rootsFile = path.join(testDb.dataDir, 'host-roots.json');
        legacy = await legacyInstall(db, before40 ? undefined : rootsFile);
        // PGlite has one connection: the server opens its own after this one is closed.
        await db.close();
        const config = loadConfig(testEnv(testDb), testDb.dataDir);
        server = await startSqlServer(config, createLogger('silent'));
      });
      after(async () => {
        await server?.close();
        await testDb?.drop();
      });

      const agentsRow = async (name: string) =>
        (await server.sql('agents').where({ name }).first()) as { id: string; token_hash: string };
      const roots = () => readHostRoots(rootsFile)!;

      it('records the tokens stored at the upgrade on the host, and the token tag key', () => {
        const recorded = roots();
        assert.ok(recorded.tokensRecorded);
        assert.ok(recorded.legacyTokenHashes.has(sha256(legacy.tagged)));
        assert.ok(recorded.legacyTokenHashes.has(sha256(legacy.untagged)));
        assert.ok(recorded.legacyTokenTagKeys.some((k) => k.equals(legacy.key)));
      });

      it('accepts a token from before the upgrade and stores it as its MAC on first use', async () => {
        for (const [name, token] of [
          ['old-tagged', legacy.tagged],
          ['old-untagged', legacy.untagged],
        ] as const) {
          assert.equal((await tryToken(server.url, token)).status, 200, name);
          assert.equal((await agentsRow(name)).token_hash, roots().mac('agent-token', token), name);
          assert.equal((await tryToken(server.url, token)).status, 200, `${name}, again`);
        }
      });

      it('stores a new agent token as a MAC, not its SHA-256', async () => {
        const made = await runAdminCommand(server.services.admin, {
          command: 'agent.add',
          name: 'new-agent',
          actor: 'test',
        });
        const token = (made as { token: string }).token;
        const row = await agentsRow('new-agent');
        assert.notEqual(row.token_hash, sha256(token));
        assert.equal(row.token_hash, roots().mac('agent-token', token));
        assert.equal((await tryToken(server.url, token)).status, 200);
      });

      it('opens nothing for an agents row inserted by SQL with the SHA-256 of a token the attacker chose', async () => {
        // The attacker read the old tag key from server_secrets: the token even passes the tag screen.
        for (const forged of [newTaggedToken(legacy.key), `cs_${randomBytes(32).toString('base64url')}`]) {
          await server.sql('agents').insert({
            id: randomUUID(),
            name: `sql-agent-${forged.length}`,
            profile: 'all',
            token_hash: sha256(forged),
            token_tagged: forged.length === 46 ? false : true,
          });
          assert.deepEqual(await tryToken(server.url, forged), { status: 401, reason: 'unknown_token' });
        }
      });

      it("opens nothing when SQL sets an existing agent's token_hash to the attacker's", async () => {
        const forged = newTaggedToken(legacy.key);
        await server
          .sql('agents')
          .where({ name: 'new-agent' })
          .update({ token_hash: sha256(forged) });
        assert.deepEqual(await tryToken(server.url, forged), { status: 401, reason: 'unknown_token' });
      });

      it('rotates and revokes an upgraded token', async () => {
        const rotated = await runAdminCommand(server.services.admin, {
          command: 'agent.rotate',
          name: 'old-tagged',
          actor: 'test',
        });
        const fresh = (rotated as { token: string }).token;
        assert.deepEqual(await tryToken(server.url, legacy.tagged), { status: 401, reason: 'unknown_token' });
        assert.equal((await tryToken(server.url, fresh)).status, 200);
        await runAdminCommand(server.services.admin, {
          command: 'agent.revoke',
          name: 'old-untagged',
          actor: 'test',
        });
        assert.deepEqual(await tryToken(server.url, legacy.untagged), {
          status: 401,
          reason: 'revoked_token',
        });
      });
    });
  }
}
