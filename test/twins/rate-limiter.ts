import { createMemoryRateLimiter } from '../../src/accounts/rate-limit.ts';
import { systemClock, type Clock } from '../../src/core/clock.ts';

/**
 * The rate limiter's twin is the embedded database's own limiter: the same sliding minute as
 * accounts/rate-limit.ts's database count (the current minute's calls plus the previous minute's,
 * weighted by how much of it the window still covers), counted in a map on `clock`, with the same answer
 * when refused. test/twins/contracts/rate-limiter.ts holds it and the database's to the same contract.
 */
export const twinRateLimiter = (clock: Clock = systemClock) => createMemoryRateLimiter(clock);
