import type { Connection } from '../../db/knex.ts';
import { createAgentAuth, createOAuthAgentAuth, createOAuthVerifier } from '../../accounts/index.ts';
import type { ClusterBus } from '../../cluster/bus.ts';
import { publicBaseUrl, type Config } from '../../config.ts';
import type { Logger } from '../../log.ts';
import { defineService, type Parts } from './parts.ts';

export const agentAuth = defineService({
  name: 'agent auth',
  needs: ['config', 'log', 'db', 'bus', 'lifecycle'],
  provides: ['authenticate', 'oauth'],
  open: ({ config, log, db, bus, lifecycle }) => authOf(config, log, db.knex, bus, lifecycle.baseUrl),
});

/**
 * Static agent tokens, and OAuth access tokens when `oauth` is configured. OAuth tokens must name this
 * server's resource URL: `oauth.audience`, else `<base>/mcp`, the base being http.public_url or, once
 * listening, the address served.
 */
function authOf(
  config: Config,
  log: Logger,
  knex: Connection,
  bus: ClusterBus,
  baseUrl: () => string | null,
): Pick<Parts, 'authenticate' | 'oauth'> {
  const authenticate = createAgentAuth(knex, bus);
  if (!config.oauth) return { authenticate };
  const { audience } = config.oauth;
  const resource = () => audience ?? `${(baseUrl() ?? publicBaseUrl(config)).replace(/\/$/, '')}/mcp`;
  return {
    authenticate,
    oauth: createOAuthAgentAuth(knex, bus, createOAuthVerifier(config.oauth, { resource, log })),
  };
}
