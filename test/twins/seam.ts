import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config.ts';
import type { BlobStore } from '../../src/connectors/index.ts';
import type { Agent } from '../../src/core/identity.ts';
import { loadProfiles } from '../../src/core/profiles.ts';
import { createLogger } from '../../src/log.ts';
import { createCallPipeline, type CallDeps } from '../../src/server/call.ts';
import { createMetrics } from '../../src/server/metrics.ts';
import { builtinTools, createCursorCodec } from '../../src/tools/index.ts';
import { inMemoryNotes } from '../helpers/twins.ts';
import { twinApprovals } from './approvals.ts';
import { twinAuditLog } from './audit-log.ts';
import { twinCatalogue } from './catalogue.ts';
import { twinClock } from './clock.ts';
import { twinConnector, twinConnectorSet } from './connectors.ts';
import { twinRateLimiter } from './rate-limiter.ts';

/** The directory every seam test's connector twin holds. */
export const CONTACTS = [
  { id: 'c_ada', display_name: 'Ada Lovelace', account: 'ada' },
  { id: 'c_alan', display_name: 'Alan Turing', account: 'alan' },
  { id: 'c_grace', display_name: 'Grace Hopper', account: 'grace', active: false },
];

/** An agent of the `all` profile, unless told otherwise. */
export const agentOf = (over: Partial<Agent> = {}): Agent => ({
  id: 'agent-1',
  name: 'unit-agent',
  profile: 'all',
  owner_id: null,
  rate_limit_per_min: null,
  ...over,
});

/** No file is read or sent by the seam's unit tests: a blob store that says so if one is. */
const noBlobs: BlobStore = {
  put: () => Promise.reject(new Error('no blobs in the seam twins')),
  pathOf: () => {
    throw new Error('no blobs in the seam twins');
  },
  read: async () => undefined,
};

/**
 * createCallPipeline over twins only: no server, no database. The built-in tools (and the real
 * catalogue's listing of them), every service the seam uses as a twin, the real config, profiles,
 * metrics and cursor codec. `env` is the config's environment (COUNTERSIGN_*).
 */
export function seamOnTwins(env: Record<string, string> = {}, deps: Partial<CallDeps> = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-seam-'));
  const config = loadConfig(env, dir);
  const clock = twinClock();
  const audit = twinAuditLog(clock);
  const approvals = twinApprovals({ audit, clock, pending_ttl_s: config.approval.pending_ttl_s });
  // Fenced as the local connector is: a send only while its approval executes.
  const connector = twinConnector(CONTACTS, (key) =>
    [...approvals.requests.values()].some((r) => r.approval_id === key && r.status === 'executing'),
  );
  const limiter = twinRateLimiter(clock);
  const catalogue = twinCatalogue(builtinTools, config);
  const metrics = createMetrics();
  const pipeline = createCallPipeline({
    tools: builtinTools,
    audit,
    connectors: twinConnectorSet({ local: connector }),
    cursors: createCursorCodec('unit-cursor-secret-unit-cursor-secret'),
    approvals,
    blobs: noBlobs,
    memory: inMemoryNotes(() => clock.now()),
    limiter,
    profiles: loadProfiles(),
    metrics,
    config,
    log: createLogger('silent'),
    clock,
    catalogue,
    ...deps,
  });
  const call = (name: string, args: unknown, agent = agentOf()) =>
    pipeline.call(agent, name, args, new AbortController().signal);
  return { pipeline, call, config, clock, audit, approvals, connector, limiter, catalogue, metrics };
}
