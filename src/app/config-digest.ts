import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import type { Config } from '../config.ts';

/** What stands in the digested config for a value that is, or may carry, a secret. */
export const REDACTED = '[redacted]';

/**
 * A URL without what may carry a credential: the password (its presence stays visible), the query and the
 * fragment, and unless `keepPath` the path. The user name and the address say where it points.
 */
function withoutCredentials(raw: string, keepPath: boolean): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return REDACTED; // unparseable: no part of it can be told safe
  }
  const user = url.username ? `${url.username}${url.password ? `:${REDACTED}` : ''}@` : '';
  return `${url.protocol}//${user}${url.host}${keepPath ? url.pathname : '/'}`;
}

/** Every value of a map of headers or environment variables may be a credential: keys stay, values go. */
const keysOnly = (map: Readonly<Record<string, string>> | undefined) =>
  map && Object.fromEntries(Object.keys(map).map((k) => [k, REDACTED]));

/**
 * The effective configuration with every secret taken out: the database password, the webhook secret
 * and the webhook URL's path (a Slack-style webhook URL is itself the credential), the metrics token,
 * the SMTP password, the Slack bot token and signing secret, the OpenID client secret, header values
 * of the bridge and of upstreams, upstream environment values, and credentials in any URL (database,
 * SMTP, OTLP, JWKS, bridge, upstreams, Slack's API). What remains says how this server is set up, and
 * may be shown and hashed.
 */
export function redactedConfig(config: Config): Record<string, unknown> {
  return {
    ...config,
    database_url: config.database_url && withoutCredentials(config.database_url, true),
    web: {
      ...config.web,
      webhook_url: config.web.webhook_url && withoutCredentials(config.web.webhook_url, false),
      webhook_secret: config.web.webhook_secret && REDACTED,
      oidc: config.web.oidc && { ...config.web.oidc, client_secret: REDACTED },
    },
    bridge: config.bridge && {
      ...config.bridge,
      url: withoutCredentials(config.bridge.url, true),
      headers: keysOnly(config.bridge.headers),
    },
    metrics: { ...config.metrics, token: config.metrics.token && REDACTED },
    notifications: {
      ...config.notifications,
      email: config.notifications.email && {
        ...config.notifications.email,
        smtp_url:
          config.notifications.email.smtp_url &&
          withoutCredentials(config.notifications.email.smtp_url, true),
        password: config.notifications.email.password && REDACTED,
      },
      slack: config.notifications.slack && {
        ...config.notifications.slack,
        api_base_url: withoutCredentials(config.notifications.slack.api_base_url, true),
        bot_token: REDACTED,
        signing_secret: REDACTED,
      },
    },
    tracing: {
      otlp_endpoint: config.tracing.otlp_endpoint && withoutCredentials(config.tracing.otlp_endpoint, true),
      otlp_traces_endpoint:
        config.tracing.otlp_traces_endpoint && withoutCredentials(config.tracing.otlp_traces_endpoint, true),
    },
    oauth: config.oauth && {
      ...config.oauth,
      jwks_uri: config.oauth.jwks_uri && withoutCredentials(config.oauth.jwks_uri, true),
    },
    upstreams: config.upstreams.map((u) => ({
      ...u,
      url: u.url && withoutCredentials(u.url, true),
      headers: keysOnly(u.headers),
      env: keysOnly(u.env),
    })),
  };
}

/**
 * SHA-256 (hex) of the RFC 8785 canonical JSON of the redacted configuration: two servers with the same
 * digest were set up alike; a changed setting changes it; no secret goes into it.
 */
export const configDigest = (config: Config): string =>
  createHash('sha256')
    .update(canonicalize(redactedConfig(config)) ?? '')
    .digest('hex');
