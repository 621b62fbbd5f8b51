import { createMemoryRateLimiter, createRateLimiter } from '../../accounts/index.ts';
import { createPace } from '../../audit/index.ts';
import { defineService, type Closers } from './parts.ts';

/** Each agent's calls a minute, and the pace at which refusals for exceeding it are answered. */
export const limits = defineService({
  name: 'limits',
  needs: ['config', 'db'],
  provides: ['limiter', 'rateLimitedPace'],
  open: ({ config, db }, closers) => ({
    // On the embedded database one process counts every call: in memory, without a statement each.
    limiter: config.database_url ? createRateLimiter(db.knex) : createMemoryRateLimiter(),
    rateLimitedPace: paceUntilStop(config.policy.rate_limited_per_second, closers),
  }),
});

/** A pace of answers (src/audit/pace.ts) whose waiting answers are let go at once on a stop. */
function paceUntilStop(perSecond: number, closers: Closers) {
  const pace = createPace({ perSecond });
  closers.push(async () => pace.release());
  return pace;
}
