import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createAgent } from '../../src/accounts/agents.ts';
import { createAgentMemory } from '../../src/accounts/store/memory.ts';
import type { Agent } from '../../src/core/identity.ts';
import { recall } from '../../src/tools/memory/recall.ts';
import { remember } from '../../src/tools/memory/remember.ts';
import type { MemoryStore } from '../../src/tools/memory/store.ts';
import type { MemoryContext } from '../../src/tools/types.ts';
import { databaseKinds, openMigratedDatabase } from '../helpers/db.ts';
import { inMemoryNotes } from '../helpers/twins.ts';

/**
 * The notes store and its in-memory twin hold to one contract, so that a test of the memory tools can
 * run on the twin with no server and no database, and still say what the real store does.
 */
function holdsTheContract(
  name: string,
  open: () => Promise<{ store: MemoryStore; agents: [string, string] }>,
) {
  describe(`the notes store: ${name}`, () => {
    let store: MemoryStore;
    let a: string;
    let b: string;
    before(async () => {
      ({
        store,
        agents: [a, b],
      } = await open());
    });

    it('reads back what was stored, until it expires', async () => {
      const { expires_at } = await store.remember(a, 's', 'k', 'v1', 3600);
      const lives = Date.parse(expires_at) - Date.now();
      assert.ok(lives > 3590_000 && lives <= 3600_000, `lives ${lives} ms`);
      assert.deepEqual(await store.recall(a, 's', 'k'), { value: 'v1', expires_at });
    });

    it('replaces a note stored again under the same key, with its new expiry', async () => {
      await store.remember(a, 's2', 'k', 'first', 60);
      const again = await store.remember(a, 's2', 'k', 'second', 7200);
      assert.deepEqual(await store.recall(a, 's2', 'k'), { value: 'second', expires_at: again.expires_at });
    });

    it('keeps agents, sessions and keys apart', async () => {
      await store.remember(a, 's3', 'k', 'mine', 60);
      assert.equal(await store.recall(b, 's3', 'k'), undefined);
      assert.equal(await store.recall(a, 'other', 'k'), undefined);
      assert.equal(await store.recall(a, 's3', 'other'), undefined);
    });

    it('does not answer with a note that has expired', async () => {
      await store.remember(a, 's4', 'k', 'gone', -1);
      assert.equal(await store.recall(a, 's4', 'k'), undefined);
    });
  });
}

holdsTheContract('in memory', async () => ({ store: inMemoryNotes(), agents: ['agent-a', 'agent-b'] }));

for (const kind of databaseKinds()) {
  let close = async () => {};
  after(() => close());
  holdsTheContract(`agent_memory on ${kind}`, async () => {
    const { testDb, db } = await openMigratedDatabase(kind);
    close = async () => {
      await db.close();
      await testDb.drop();
    };
    const agents = await Promise.all(['mem-a', 'mem-b'].map((name) => createAgent(db.knex, { name })));
    return { store: createAgentMemory(db.knex), agents: [agents[0]!.agent.id, agents[1]!.agent.id] };
  });
}

describe('the memory tools on the twin (no server, no database)', () => {
  const agent: Agent = {
    id: 'agent-1',
    name: 'unit',
    profile: 'all',
    owner_id: null,
    rate_limit_per_min: null,
  };
  let now = new Date('2026-12-03T10:00:00.000Z');
  const ctx: MemoryContext = {
    agent,
    request_id: 'r',
    trace_id: 't',
    signal: new AbortController().signal,
    memory: inMemoryNotes(() => now),
  };

  it('remembers for the TTL asked and recalls it, with the audit facts the row records', async () => {
    const args = remember.input.parse({ session_id: 's', key: 'draft', value: 'שלום', ttl_seconds: 120 });
    const stored = await remember.handler(args, ctx);
    assert.equal(stored.data.expires_at, '2026-12-03T10:02:00.000Z');
    assert.deepEqual(stored.audit, { source: 'local', details: { ttl_seconds: 120, bytes: 8 } });
    const got = await recall.handler(recall.input.parse({ session_id: 's', key: 'draft' }), ctx);
    assert.deepEqual(got.data, {
      session_id: 's',
      key: 'draft',
      found: true,
      value: 'שלום',
      expires_at: '2026-12-03T10:02:00.000Z',
    });
  });

  it('answers found=false and empty once the note has expired', async () => {
    now = new Date('2026-12-03T10:05:00.000Z');
    const got = await recall.handler(recall.input.parse({ session_id: 's', key: 'draft' }), ctx);
    assert.deepEqual([got.data.found, got.data.value, got.empty], [false, null, true]);
  });

  it('refuses a value over 64 KiB before anything is stored', async () => {
    const args = remember.input.parse({ session_id: 's', key: 'big', value: 'x'.repeat(64 * 1024 + 1) });
    await assert.rejects(remember.handler(args, ctx), {
      code: 'INVALID_ARGUMENT',
      reason: 'value_too_large',
    });
    const got = await recall.handler(recall.input.parse({ session_id: 's', key: 'big' }), ctx);
    assert.equal(got.data.found, false);
  });
});
