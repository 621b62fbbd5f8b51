import type { Knex } from 'knex';
import type { ClusterBus } from '../cluster/bus.ts';
import { authenticate, hashToken } from '../accounts/agents.ts';
import { type Agent } from '../core/identity.ts';

/** Resolves an agent token (missing, unknown and revoked ones are failures). */
export type Authenticate = (token: string | undefined) => ReturnType<typeof authenticate>;

/** How long a cached agent is trusted without word from PostgreSQL (a listening connection cut silently). */
const TRUST_MS = 10_000;
const MAX_ENTRIES = 10_000;

/**
 * Token → agent, cached per replica only while PostgreSQL can tell this replica that an agent changed: a
 * trigger on `agents` announces every change on LISTEN/NOTIFY (src/cluster/bus.ts), which drops the
 * agent's entries. While the listening connection is down nothing is served from the cache; an entry is
 * never trusted for longer than TRUST_MS. So a revocation, a profile or rate-limit change holds from
 * the agent's next call after PostgreSQL delivered the notification (a few milliseconds after commit).
 * Failures (unknown, revoked) are not cached: they are read again.
 */
export function createAgentAuth(knex: Knex, bus: ClusterBus): Authenticate {
  const cache = new Map<string, { agent: Agent; at: number }>();
  /** Bumped on every announcement: a read that straddled one is not cached. */
  let generation = 0;
  bus.onAgentChanged((id) => {
    generation++;
    if (id === '*') cache.clear();
    else for (const [key, entry] of cache) if (entry.agent.id === id) cache.delete(key);
  });
  return async (token) => {
    if (!token) return authenticate(knex, token);
    const key = hashToken(token);
    const hit = cache.get(key);
    if (hit && bus.listening() && performance.now() - hit.at < TRUST_MS) return { agent: hit.agent };
    const seen = generation;
    const result = await authenticate(knex, token);
    if (!('failure' in result) && bus.listening() && seen === generation) {
      if (cache.size >= MAX_ENTRIES) cache.delete(cache.keys().next().value!);
      cache.set(key, { agent: result.agent, at: performance.now() });
    }
    return result;
  };
}
