import type { Connection } from '../db/knex.ts';
import type { ClusterBus } from '../cluster/bus.ts';
import { anyUntaggedToken, authenticate, hashToken } from './agents.ts';
import { tokenShape, tokenTagKeys } from './token-tag.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { hostRootsOf } from '../db/host-roots.ts';
import { findAgentByName, type OAuthFailure, type OAuthVerifier } from './oauth.ts';
import { type Agent } from '../core/identity.ts';

/** Resolves an agent token (missing, unknown and revoked ones are failures). */
export type Authenticate = (token: string | undefined) => ReturnType<typeof authenticate>;

/** An OAuth access token's agent, or why not; `subject` is the client the token named, once verified. */
export type OAuthAuthenticate = (
  token: string,
) => Promise<{ agent: Agent } | { failure: OAuthFailure; agent?: Agent; subject?: string }>;

/** Agents on HTTP by OAuth access token: the check, and what the protected-resource metadata shows. */
export interface OAuthAgents {
  authenticate: OAuthAuthenticate;
  verifier: OAuthVerifier;
}

/** How long a cached agent is trusted without word from PostgreSQL (a listening connection cut silently). */
const TRUST_MS = 10_000;
const MAX_ENTRIES = 10_000;

type Lookup<F> = { agent: Agent } | { failure: F; agent?: Agent };

/**
 * Key → agent, cached per replica only while every change to an agent reaches it
 * (ClusterBus.agentChangesAnnounced): on PostgreSQL a trigger on `agents` announces every change on
 * LISTEN/NOTIFY (src/cluster/bus.ts), which drops the agent's entries, and while the listening
 * connection is down nothing is served from the cache; on the embedded database every change is this
 * process's own command, which drops them as it commits (agentChangedHere). An entry is
 * never trusted for longer than TRUST_MS. So a revocation, a profile or rate-limit change holds from
 * the agent's next call after PostgreSQL delivered the notification (a few milliseconds after commit),
 * and at once on the replica whose command made it (`ClusterBus.agentChangedHere`).
 * Failures (unknown, revoked) are not cached: they are read again.
 */
function agentCache(bus: ClusterBus) {
  const cache = new Map<string, { agent: Agent; at: number }>();
  /** Bumped on every announcement: a read that straddled one is not cached. */
  let generation = 0;
  bus.onAgentChanged((id) => {
    generation++;
    if (id === '*') cache.clear();
    else for (const [key, entry] of cache) if (entry.agent.id === id) cache.delete(key);
  });
  return async <F>(key: string, load: () => Promise<Lookup<F>>): Promise<Lookup<F>> => {
    const hit = cache.get(key);
    if (hit && bus.agentChangesAnnounced() && performance.now() - hit.at < TRUST_MS)
      return { agent: hit.agent };
    const seen = generation;
    const result = await load();
    if (!('failure' in result) && bus.agentChangesAnnounced() && seen === generation) {
      if (cache.size >= MAX_ENTRIES) cache.delete(cache.keys().next().value!);
      cache.set(key, { agent: result.agent, at: performance.now() });
    }
    return result;
  };
}

/** How long this replica trusts its word that an active agent holds an untagged token, at most. */
const UNTAGGED_RECHECK_MS = 60_000;

/**
 * Whether a token may be an agent's at all, from memory (token-tag.ts): a tagged one with its tag
 * right, or one from before tags while an active agent still holds such a token. That last is read
 * from the database once, and again after an agent changes or a minute: it can only go from yes to no
 * (every token issued now is tagged), so a stale answer costs a query, never a refusal.
 */
function tokenScreen(knex: Connection, bus: ClusterBus, roots: () => Promise<HostRoots>) {
  let keys: Promise<Buffer[]> | undefined;
  let untagged: { any: Promise<boolean>; at: number } | undefined;
  bus.onAgentChanged(() => (untagged = undefined));
  const retried = <T>(p: Promise<T>, forget: () => void) =>
    p.catch((err: unknown) => {
      forget();
      throw err;
    });
  return async (token: string): Promise<boolean> => {
    keys ??= retried(roots().then(tokenTagKeys), () => (keys = undefined));
    const shape = tokenShape(await keys, token);
    if (shape !== 'untagged') return shape === 'tagged';
    if (!untagged || performance.now() - untagged.at > UNTAGGED_RECHECK_MS)
      untagged = {
        any: retried(anyUntaggedToken(knex), () => (untagged = undefined)),
        at: performance.now(),
      };
    return untagged.any;
  };
}

/**
 * Static agent tokens, cached by their SHA-256 (in memory only); one that cannot be an agent's is
 * refused with no query. `roots` are the host's keys (by default those opened for `knex`).
 */
export function createAgentAuth(
  knex: Connection,
  bus: ClusterBus,
  roots: () => Promise<HostRoots> = () => hostRootsOf(knex),
): Authenticate {
  const cached = agentCache(bus);
  const mayBeAgents = tokenScreen(knex, bus, roots);
  return async (token) => {
    if (!token) return authenticate(knex, token);
    // Screened and MAC'd on a miss only: a cached agent's calls pay no HMAC.
    return cached(hashToken(token), async () =>
      (await mayBeAgents(token))
        ? authenticate(knex, token, await roots())
        : { failure: 'unknown_token' as const },
    );
  };
}

/**
 * OAuth access tokens: the JWT is verified in process (no database), and the agent it maps to is read
 * through the same kind of cache by name, so a call costs no more round trips than a static token's.
 */
export function createOAuthAgentAuth(
  knex: Connection,
  bus: ClusterBus,
  verifier: OAuthVerifier,
): OAuthAgents {
  const cached = agentCache(bus);
  return {
    verifier,
    async authenticate(token) {
      const verdict = await verifier.verify(token);
      if ('failure' in verdict) return verdict;
      const found = await cached(verdict.agent_name, () => findAgentByName(knex, verdict.agent_name));
      return 'failure' in found ? { ...found, subject: verdict.subject } : found;
    },
  };
}
