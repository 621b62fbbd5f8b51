/**
 * The accounts' front door: the only file of accounts/ that modules outside it import
 * (.dependency-cruiser.cjs holds every floor to it). Agents and their tokens, profiles and call
 * limits, users, sign-in and single sign-on.
 */
export { createAgentAuth, createOAuthAgentAuth, type Authenticate, type OAuthAgents } from './agent-cache.ts';
export {
  createAgent,
  listAgents,
  ownerNamed,
  revokeAgent,
  rotateAgentToken,
  storedTokenHashes,
  updateAgent,
  type AuthFailure,
} from './agents.ts';
export { OAUTH_FAILURE_DETAIL, OAuthFailure, createOAuthVerifier, looksLikeJwt } from './oauth.ts';
export { identityOf } from './oidc-users.ts';
export {
  OIDC_FAILURE_PAGE,
  OidcAttempt,
  createOidcClient,
  type OidcClient,
  type OidcRefusal,
} from './oidc.ts';
export { createMemoryRateLimiter, createRateLimiter, type RateLimiter } from './rate-limit.ts';
export { SIGN_IN_WINDOW_MINUTES, createSignIn, type SignIn, type SignInLimits } from './sign-in.ts';
export {
  changeUser,
  createUser,
  linkIdentity,
  listUsers,
  setUserEmail,
  type UserChange,
  createUserDirectory,
  type UserDirectory,
} from './users.ts';
export { createAgentMemory } from './store/memory.ts';
export { createSessionStore, type SessionStore, type WebSession } from './sessions.ts';
export {
  activeAgentNamed,
  agentById,
  agentNamedForUpdate,
  agentWithOwner,
  countAgents,
  type AgentRecord,
} from './agents.ts';
export { countUsers, heldBy, setUserTeams, TeamName, userNameOf } from './users.ts';
export { createAccountAdmin, type AccountAdmin, type AccountChanges, type AccountRow } from './admin.ts';
export { agentSealed, sealUnsealedRecords, tamperedRecord, userSealed } from './authority.ts';
export { userSupersededSql } from './store/index.ts';
