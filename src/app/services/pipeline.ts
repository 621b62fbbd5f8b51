import { createAgentMemory } from '../../accounts/index.ts';
import { loadProfiles } from '../../core/profiles.ts';
import { createCallPipeline, createMetrics } from '../../server/index.ts';
import { builtinTools, createCursorCodec, type MemoryStore } from '../../tools/index.ts';
import { defineService } from './parts.ts';

/** The agents' profiles: one that breaks the rules is known before any wait for the database. */
export const profiles = defineService({
  name: 'profiles',
  needs: ['config'],
  provides: ['profiles'],
  open: ({ config }) => ({ profiles: loadProfiles(config.policy.profiles_dir) }),
});

/** The codec of list cursors, keyed by the host roots. */
export const cursors = defineService({
  name: 'cursors',
  needs: ['opened'],
  provides: ['cursors'],
  open: ({ opened }) => ({ cursors: createCursorCodec(opened.roots.key('cursor').toString('base64url')) }),
});

/** The agents' notes (the memory tools). */
export const memory = defineService({
  name: 'memory',
  needs: ['db'],
  provides: ['memory'],
  open: ({ db }) => ({ memory: createAgentMemory(db.knex) satisfies MemoryStore }),
});

/** Counters and waits, with every statement the database runs counted. */
export const metrics = defineService({
  name: 'metrics',
  needs: ['db'],
  provides: ['metrics'],
  open({ db }) {
    const metrics = createMetrics();
    metrics.waits.watch(db.knex.on('query', () => metrics.statement()));
    return { metrics };
  },
});

/** The one seam every call passes (server/call.ts): the built-in tools and the upstreams' behind it. */
export const pipeline = defineService({
  name: 'pipeline',
  needs: [
    'upstreams',
    'memory',
    'limiter',
    'rateLimitedPace',
    'profiles',
    'metrics',
    'audit',
    'connectors',
    'cursors',
    'approvals',
    'blobs',
    'config',
    'log',
    'faults',
    'tracer',
  ],
  provides: ['pipeline'],
  open: (have) => ({ pipeline: createCallPipeline({ tools: builtinTools, ...have }) }),
});
