import assert from 'node:assert/strict';
import { sealAgent } from '../../src/accounts/authority.ts';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { createAgentAuth, type Authenticate } from '../../src/accounts/agent-cache.ts';
import { createAgent, rotateAgentToken, storedToken } from '../../src/accounts/agents.ts';
import { newTaggedToken, tokenShape, tokenTagKey } from '../../src/accounts/token-tag.ts';
import { createLocalBus, type ClusterBus } from '../../src/cluster/bus.ts';
import { hostRootsOf } from '../../src/db/host-roots.ts';
import type { Database } from '../../src/db/knex.ts';
import { createLogger } from '../../src/log.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';

/** A token of the shape issued before tags: cs_ and 43 characters. */
const untagged = () => `cs_${randomBytes(32).toString('base64url')}`;
/** A token of the tagged shape (cs_ and 55 characters) that nobody issued. */
const forgedTagged = () => `cs_${randomBytes(41).toString('base64url')}`;

describe('the tag of an agent token', () => {
  const key = randomBytes(32);

  it('passes a token made under the key, and nothing else', () => {
    const token = newTaggedToken(key);
    assert.match(token, /^cs_[A-Za-z0-9_-]{55}$/);
    assert.equal(tokenShape(key, token), 'tagged');
    assert.equal(tokenShape(randomBytes(32), token), 'forged', 'under another key');
    // One character of the tag changed, one of the body changed, one more or one fewer.
    const last = token.at(-1) === 'A' ? 'B' : 'A';
    assert.equal(tokenShape(key, token.slice(0, -1) + last), 'forged');
    const third = token[3] === 'A' ? 'B' : 'A';
    assert.equal(tokenShape(key, `cs_${third}${token.slice(4)}`), 'forged');
    assert.equal(tokenShape(key, `${token}A`), 'forged');
    assert.equal(tokenShape(key, token.slice(0, -1)), 'forged');
    assert.equal(tokenShape(key, forgedTagged()), 'forged');
  });

  it('tells a token from before tags, and anything else, from a tagged one', () => {
    assert.equal(tokenShape(key, untagged()), 'untagged');
    for (const other of ['cs_not-a-token-1', 'Bearer', '', `xx_${randomBytes(32).toString('base64url')}`])
      assert.equal(tokenShape(key, other), 'forged', JSON.stringify(other));
  });
});

for (const kind of databaseKinds()) {
  describe(`agent tokens on ${kind}: a token nobody issued costs no query`, () => {
    let testDb: TestDatabase;
    let db: Database;
    let bus: ClusterBus;
    let auth: Authenticate;
    let statements = 0;

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
      bus = createLocalBus(createLogger('silent'));
      auth = createAgentAuth(db.knex, bus);
      db.knex.on('query', () => statements++);
    });
    after(async () => {
      await db.close();
      await testDb.drop();
    });

    /** Statements run while `fn` runs. */
    const counted = async (fn: () => Promise<void>) => {
      const before = statements;
      await fn();
      return statements - before;
    };

    it('issues tagged tokens, and refuses 200 random ones, tagged-shaped or from before tags, with none', async () => {
      const { agent, token } = await createAgent(db.knex, { name: 'tagged-agent' });
      assert.equal(tokenShape(tokenTagKey(await hostRootsOf(db.knex)), token), 'tagged');
      const first = await auth(token);
      assert.ok('agent' in first && !('failure' in first) && first.agent.id === agent.id);
      const queries = await counted(async () => {
        for (let i = 0; i < 100; i++) {
          assert.deepEqual(await auth(forgedTagged()), { failure: 'unknown_token' });
          assert.deepEqual(await auth(untagged()), { failure: 'unknown_token' });
        }
      });
      assert.equal(queries, 1, 'one statement: whether any agent holds a token from before tags');
      // And the issued token still authenticates (from the cache, or by its row).
      const again = await auth(token);
      assert.ok('agent' in again && !('failure' in again) && again.agent.id === agent.id);
    });

    it('looks a token from before tags up while an active agent holds one, and not once it has rotated', async () => {
      // An agent as one made before tags was: its token untagged, token_tagged false (stored as its
      // MAC, as the first use after the upgrade to MACs leaves it).
      const old = untagged();
      const roots = await hostRootsOf(db.knex);
      const row = {
        id: '00000000-0000-4000-8000-0000000000aa',
        name: 'old-agent',
        profile: 'all',
        token_hash: storedToken(roots, old),
      };
      // Sealed as the first start after the upgrade to sealed records leaves it (accounts/authority.ts).
      await db
        .knex('agents')
        .insert({ ...row, authority_mac: sealAgent(roots, { ...row, revoked_at: null }) });
      bus.agentChangedHere('00000000-0000-4000-8000-0000000000aa');
      const found = await auth(old);
      assert.ok('agent' in found && !('failure' in found) && found.agent.name === 'old-agent');
      // Looked up now: a random one of that shape costs its query (and is refused).
      assert.deepEqual(await auth(untagged()), { failure: 'unknown_token' });
      assert.ok((await counted(() => auth(untagged()).then(() => undefined))) >= 1);

      const rotated = await rotateAgentToken(db.knex, 'old-agent');
      assert.ok(rotated);
      bus.agentChangedHere(rotated.agent_id);
      assert.deepEqual(await auth(old), { failure: 'unknown_token' }, 'the old token is refused');
      const fresh = await auth(rotated.token);
      assert.ok('agent' in fresh && !('failure' in fresh) && fresh.agent.name === 'old-agent');
      const queries = await counted(async () => {
        for (let i = 0; i < 50; i++) assert.deepEqual(await auth(untagged()), { failure: 'unknown_token' });
      });
      assert.equal(queries, 0, 'no active agent holds a token from before tags: refused from memory');
    });
  });
}
