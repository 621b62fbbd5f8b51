import type { Config } from '../../config.ts';
import { connectUpstream, createUpstreamPins, type UpstreamPins } from '../../connectors/index.ts';
import type { ClusterBus } from '../../cluster/bus.ts';
import { VERSION } from '../../core/version.ts';
import type { Logger } from '../../log.ts';
import type { WaitAccount } from '../../server/index.ts';
import { defineService, type Closers } from './parts.ts';

/** What each upstream tool was when first listed (its pin), and what changed since. */
export const pins = defineService({
  name: 'upstream pins',
  needs: ['db', 'audit', 'log'],
  provides: ['pins'],
  open: ({ db, audit, log }) => ({ pins: createUpstreamPins({ knex: db.knex, audit, log }) }),
});

export const upstreams = defineService({
  name: 'upstreams',
  needs: ['config', 'log', 'bus', 'pins', 'metrics'],
  provides: ['upstreams'],
  open: async ({ config, log, bus, pins, metrics }, closers) => ({
    upstreams: await connectUpstreams(config, log, bus, pins, closers, metrics.waits),
  }),
});

/** How long start-up waits for upstreams' first connection. */
const UPSTREAM_START_WAIT_MS = 10_000;

/** An upstream call's own deadline stays inside the call's, so that a slow upstream answers TIMEOUT. */
export const upstreamTimeoutMs = (config: Pick<Config, 'limits'>) =>
  Math.max(100, Math.floor(config.limits.call_timeout_ms * 0.9));

/**
 * Upstream MCP servers: connected in the background; start-up waits a little for their first
 * listing, never for an upstream that is down (its tools answer SOURCE_UNAVAILABLE meanwhile).
 */
async function connectUpstreams(
  config: Config,
  log: Logger,
  bus: ClusterBus,
  pins: UpstreamPins,
  closers: Closers,
  waits: WaitAccount,
) {
  const upstreams = config.upstreams
    .map((u) =>
      connectUpstream(u, {
        ...{ log, timeoutMs: u.timeout_ms ?? upstreamTimeoutMs(config) },
        ...{ clientVersion: VERSION, pins },
      }),
    )
    // Each call timed from its request to its answer: the upstream's part of a call's wait.
    .map((u) => ({ ...u, call: waits.upstream(u.call) }));
  closers.push(async () => {
    await Promise.all(upstreams.map((u) => u.close()));
  });
  await Promise.race([
    Promise.all(upstreams.map((u) => u.firstAttempt)),
    new Promise((r) => setTimeout(r, UPSTREAM_START_WAIT_MS).unref()),
  ]);
  // Another replica heard an upstream's list change: list ours again, so that every replica answers alike.
  const stopRelisting = bus.onForeign((event) => {
    if (event.kind === 'tools_list_changed') for (const u of upstreams) void u.refresh();
  });
  closers.push(async () => stopRelisting());
  return upstreams;
}
