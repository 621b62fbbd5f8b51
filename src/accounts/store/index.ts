/**
 * Accounts' stores: every statement on the tables accounts owns (users, agents, web_sessions,
 * sign_in_attempts, rate_windows, agent_memory). The rule files of accounts/ hand these a connection
 * or their transaction; they never build a statement themselves.
 */
export * as users from './users.ts';
export * as agents from './agents.ts';
export * as sessions from './sessions.ts';
export * as attempts from './sign-in-attempts.ts';
export type { AttemptBucket } from './sign-in-attempts.ts';
export * as rateWindows from './rate-windows.ts';
export { createAgentMemory } from './memory.ts';
export {
  AGENT_CHANGE_KINDS,
  AGENT_SEALED_COLUMNS,
  AGENT_SUPERSEDED,
  USER_CHANGE_KINDS,
  USER_SEALED_COLUMNS,
  USER_SUPERSEDED,
  agentSupersededSql,
  userSupersededSql,
  type AgentSealed,
  type UserRecord,
} from './sql.ts';
export type { AgentRecord } from './agents.ts';
