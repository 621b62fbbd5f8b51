import { createApprovals, createPatternPool, type Approvals } from '../../approval/index.ts';
import { withSpans, type Tracer } from '../../core/tracing.ts';
import { defineService, type Closers } from './parts.ts';

/** The rules' long matches run on worker threads, stopped with the server (approval/rules/pattern-pool.ts). */
export const patterns = defineService({
  name: 'patterns',
  needs: [],
  provides: ['patterns'],
  open: (_, closers) => ({ patterns: closing(createPatternPool(), closers) }),
});

export const approvals = defineService({
  name: 'approvals',
  needs: ['tracer', 'db', 'audit', 'config', 'roots', 'patterns', 'lifecycle', 'notifications'],
  provides: ['approvals'],
  open: ({ tracer, db, audit, config, roots, patterns, lifecycle, notifications }) => ({
    approvals: openApprovals(tracer, {
      ...{ knex: db.knex, audit, config, roots, patterns },
      ...{ reviewUrl: lifecycle.reviewUrl, onQueued: notifications?.kick },
    }),
  }),
});

/** `thing`, closed with the rest. */
function closing<T extends { close(): Promise<void> }>(thing: T, closers: Closers): T {
  closers.push(() => thing.close());
  return thing;
}

/** The approval module, its steps that change state each in a span when tracing is on. */
function openApprovals(tracer: Tracer | undefined, deps: Parameters<typeof createApprovals>[0]): Approvals {
  const approvals = createApprovals(deps);
  if (!tracer) return approvals;
  return withSpans(approvals, tracer, {
    request: 'approval.request',
    decide: 'approval.decide',
    beginExecution: 'approval.execute',
    finishExecution: 'approval.finish',
  });
}
