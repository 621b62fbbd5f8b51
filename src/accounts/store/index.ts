/**
 * Accounts' stores: statements on the tables accounts owns. The rule files of accounts/ hand these a
 * connection or their transaction; they never build a statement themselves.
 */
export * as attempts from './sign-in-attempts.ts';
export type { AttemptBucket } from './sign-in-attempts.ts';
export * as rateWindows from './rate-windows.ts';
export { createAgentMemory } from './memory.ts';
