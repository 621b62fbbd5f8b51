import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { PolicyDoc } from './core/approval-policy.ts';
import { AppError } from './core/errors.ts';
import { AgentName, Role, UserName } from './core/identity.ts';

const MiB = 1024 * 1024;
/** The host roots file's name in the data directory when secrets.host_roots_path is not set. */
export const HOST_ROOTS_FILE = 'host-roots.json';

/** How countersign treats one upstream tool; overrides the upstream's own annotations. */
export const UpstreamToolMode = z.enum(['read', 'write', 'hidden']);
export type UpstreamToolMode = z.infer<typeof UpstreamToolMode>;

/** An upstream MCP server: a command spoken to over stdio, or a Streamable HTTP URL. */
export const UpstreamSchema = z
  .strictObject({
    /** Tools are exposed as `<name>__<tool>`. */
    name: z
      .string()
      .regex(/^[a-z][a-z0-9-]{0,31}$/, 'lowercase letters, digits and hyphens, starting with a letter'),
    /** Upstream tool name → read, write or hidden; wins over the upstream's annotations. */
    tools: z.record(z.string().min(1), UpstreamToolMode).default({}),
    /**
     * Whether a first listing's `readOnlyHint: true` makes a read (default). false: every tool the config
     * does not map is a gated write, whatever the upstream says.
     */
    trust_annotations: z.boolean().default(true),
    /** Deadline of one upstream call (default: 90 % of limits.call_timeout_ms). */
    timeout_ms: z.number().int().positive().optional(),
    /** The largest answer read from it (one stdio message, one HTTP answer or event); past it: result_too_large. */
    max_result_bytes: z
      .number()
      .int()
      .min(1024)
      .default(8 * 1024 * 1024),
    // stdio
    command: z.string().min(1).optional(),
    args: z.array(z.string()).optional(),
    env: z.record(z.string(), z.string()).optional(),
    cwd: z.string().min(1).optional(),
    // Streamable HTTP
    url: z.url({ protocol: /^https?$/ }).optional(),
    headers: z.record(z.string(), z.string()).optional(),
  })
  .superRefine((u, ctx) => {
    if (Boolean(u.command) === Boolean(u.url)) {
      ctx.addIssue({ code: 'custom', message: 'give either "command" (stdio) or "url" (Streamable HTTP)' });
    }
    const misplaced = u.command
      ? (['headers'] as const).filter((k) => u[k] !== undefined)
      : (['args', 'env', 'cwd'] as const).filter((k) => u[k] !== undefined);
    for (const key of misplaced) {
      ctx.addIssue({
        code: 'custom',
        message: `"${key}" belongs to ${u.command ? 'an HTTP' : 'a stdio'} upstream`,
        path: [key],
      });
    }
  });
export type UpstreamConfig = z.infer<typeof UpstreamSchema>;

/** Issuers are reached over TLS; plain http only on this machine (development, tests). */
const tlsOrLoopback = (url: string) =>
  /^https:/.test(url) || /^http:\/\/(localhost|127\.0\.0\.1|\[::1\])(:\d+)?(\/|$)/.test(url);
const IssuerUrl = z.url().refine(tlsOrLoopback, 'must be an https:// URL (http:// only for localhost)');

/** The authorization server whose JWT access tokens agents may present, and how a token names its agent. */
export const OAuthSchema = z.strictObject({
  /** Must equal the tokens' `iss`; its metadata (RFC 8414 or OpenID discovery) names the JWKS. */
  issuer: IssuerUrl,
  /** The JWKS, when the issuer publishes no metadata; skips discovery. */
  jwks_uri: IssuerUrl.optional(),
  /** This server's resource URL (RFC 8707), which tokens must name in `aud`; default `<public url>/mcp`. */
  audience: z.url().optional(),
  /** The claim that names the client (e.g. `client_id`, `sub`). */
  agent_claim: z.string().min(1).default('client_id'),
  /** Claim value → agent name: only the clients listed here act, each as the agent it maps to. */
  agents: z
    .record(z.string().min(1), AgentName)
    .refine((m) => Object.keys(m).length > 0, 'map at least one claim value to an agent name'),
  /** Advertised in the protected-resource metadata (RFC 9728); not enforced. */
  scopes_supported: z.array(z.string().min(1)).optional(),
  /** Leeway for `exp` and `nbf` against clock skew between the issuer and this server. */
  clock_tolerance_s: z.number().int().min(0).max(300).default(30),
});
export type OAuthConfig = z.infer<typeof OAuthSchema>;

/** Paths the web UI serves itself, which the OpenID callback must not shadow. */
const RESERVED_PATHS = ['/login', '/login/oidc', '/logout'];

/**
 * Single sign-on for the web UI with an OpenID Connect provider (docs/identity.md): authorization code +
 * PKCE, the person's roles mapped from one claim of their ID token (or UserInfo).
 */
export const OidcSchema = z.strictObject({
  /** Discovery is `<issuer>/.well-known/openid-configuration`, which must name this same issuer. */
  issuer: IssuerUrl,
  client_id: z.string().min(1),
  client_secret: z.string().min(1),
  /** How the client secret is sent to the token endpoint. */
  token_endpoint_auth_method: z
    .enum(['client_secret_basic', 'client_secret_post'])
    .default('client_secret_basic'),
  /** Where the provider sends the browser back; the redirect URI is `<public url><redirect_path>`. */
  redirect_path: z
    .string()
    .regex(/^\/[A-Za-z0-9._~/-]*$/, 'a path starting with "/"')
    .refine((p) => !RESERVED_PATHS.includes(p), `must not be one of ${RESERVED_PATHS.join(', ')}`)
    .default('/login/oidc/callback'),
  scopes: z
    .array(z.string().regex(/^[\x21\x23-\x5b\x5d-\x7e]+$/, 'a scope token'))
    .refine((s) => s.includes('openid'), 'must include "openid"')
    .default(['openid', 'email', 'profile']),
  /** The button reads "Sign in with <label>". */
  label: z.string().min(1).max(60).default('single sign-on'),
  /** A new user's name: the first of these claims that holds a valid user name. */
  username_claims: z.array(z.string().min(1)).min(1).default(['preferred_username', 'email']),
  /** The claim whose value (a string or a list of strings) gives the roles, e.g. `groups` or `roles`. */
  role_claim: z.string().min(1).default('groups'),
  /** Claim value → roles: a person holds every role that any of their values maps to. */
  roles: z
    .record(z.string().min(1), z.array(Role).min(1))
    .refine((m) => Object.keys(m).length > 0, 'map at least one claim value to roles'),
});
export type OidcConfig = z.infer<typeof OidcSchema>;

/** What notices tell of (docs/notifications.md): a new request, a decision, an expiry. */
export const NotificationEvent = z.enum(['requested', 'decided', 'expired']);
export type NotificationEvent = z.infer<typeof NotificationEvent>;

/** An SMTP relay for notices by e-mail: a URL, or host and port with optional credentials. */
export const EmailSchema = z
  .strictObject({
    /** smtp://user:password@host:587 or smtps://…:465; instead of host, port, secure, user, password. */
    smtp_url: z.url({ protocol: /^smtps?$/ }).optional(),
    host: z.string().min(1).optional(),
    port: z.number().int().min(1).max(65535).default(587),
    /** TLS from the first byte (port 465); otherwise STARTTLS when the relay offers it. */
    secure: z.boolean().default(false),
    user: z.string().min(1).optional(),
    password: z.string().min(1).optional(),
    /** The sender, e.g. "countersign <countersign@example.com>". */
    from: z.string().min(3),
    /** Fixed recipients; empty (the default): every active chair with an e-mail address. */
    to: z.array(z.email()).default([]),
  })
  .superRefine((e, ctx) => {
    if (Boolean(e.smtp_url) === Boolean(e.host)) {
      ctx.addIssue({ code: 'custom', message: 'give either "smtp_url" or "host"', path: ['host'] });
    }
    if (e.password && !e.user) {
      ctx.addIssue({ code: 'custom', message: 'a password needs a user', path: ['user'] });
    }
  });
export type EmailConfig = z.infer<typeof EmailSchema>;

/**
 * Slack as a channel with Approve / Reject buttons (docs/notifications.md): the bot posts each new request
 * to one channel and Slack calls back POST /slack/interactions, signed with the app's signing secret.
 */
export const SlackSchema = z.strictObject({
  /** The bot's OAuth token (xoxb-…), with the scopes chat:write, users:read and users:read.email. */
  bot_token: z.string().min(10),
  /** The app's signing secret: callbacks signed with anything else are refused. */
  signing_secret: z.string().min(16),
  /** The channel's id (C…, or G… for a private one), not its name. */
  channel: z.string().regex(/^[CGD][A-Z0-9]{2,}$/, 'a Slack channel id such as C0123456789'),
  /** Slack's Web API; another base serves a stand-in (tests, a proxy). */
  api_base_url: z.url().default('https://slack.com/api'),
  /** Slack user id → countersign user name; a Slack user not listed is matched by e-mail address. */
  users: z
    .record(z.string().regex(/^[UW][A-Z0-9]{2,}$/, 'a Slack user id such as U0123456789'), UserName)
    .default({}),
});
export type SlackConfig = z.infer<typeof SlackSchema>;

/** The notification outbox and its channels (docs/notifications.md); the webhook's keys stay in `web`. */
export const NotificationsSchema = z.strictObject({
  events: z.array(NotificationEvent).default(['requested', 'decided', 'expired']),
  /** A notice not delivered this long after it was queued is given up (`failed`); default 1 day. */
  retry_horizon_s: z.number().int().positive().default(86_400),
  /** Delay before the first retry; each next one doubles, up to backoff_max_ms. */
  backoff_initial_ms: z.number().int().positive().default(30_000),
  backoff_max_ms: z.number().int().positive().default(3_600_000),
  /** How often the leading replica looks for due notices (new ones of its own go out at once). */
  poll_interval_ms: z.number().int().positive().default(5_000),
  /** Deadline of one delivery attempt. */
  send_timeout_ms: z.number().int().positive().default(10_000),
  email: EmailSchema.optional(),
  slack: SlackSchema.optional(),
});

/**
 * Whether a PostgreSQL URL names its database (a path after the host, or `?database=`/`?dbname=`).
 * Without one the server's maintenance database `postgres` would silently take the tables.
 */
function namesDatabase(raw: string): boolean {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return true; // not parseable as a URL: the driver reports that itself, naming the key
  }
  if (decodeURIComponent(url.pathname.replace(/^\//, '')) !== '') return true;
  return ['database', 'dbname'].some((k) => (url.searchParams.get(k) ?? '') !== '');
}

/** The whole configuration: one schema, parsed once at start-up and frozen. */
export const ConfigSchema = z
  .strictObject({
    data_dir: z.string().min(1).default('./data'),
    database_url: z
      .string()
      .regex(/^postgres(ql)?:\/\//, 'must be a postgres:// or postgresql:// URL')
      .refine(namesDatabase, {
        message:
          'names no database, so PostgreSQL would use its maintenance database "postgres": ' +
          'append the database to use, e.g. postgres://user@host:5432/countersign',
      })
      .optional(),
    /** How start-up waits for a PostgreSQL that cannot be reached yet (docs/operations.md). */
    database: z
      .strictObject({
        /** How long start-up retries connecting and migrating before it exits 1. */
        startup_timeout_s: z.number().int().positive().default(60),
      })
      .prefault({}),
    log_level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    /** Seed the multilingual demo and a demo agent the first time the database is empty. */
    demo: z.boolean().default(true),
    http: z
      .strictObject({
        host: z.string().min(1).default('127.0.0.1'),
        port: z.number().int().min(0).max(65535).default(8787),
        /** Host names accepted in the Host and Origin headers (DNS-rebinding protection). */
        allowed_hosts: z.array(z.string().min(1)).default(['localhost', '127.0.0.1', '[::1]']),
        /** Base URL shown to people (review links); defaults to http://host:port. */
        public_url: z.url().optional(),
        max_body_bytes: z
          .number()
          .int()
          .positive()
          .default(1 * MiB),
        /** Open `subscriptions/listen` streams one agent may hold on one replica; the next is refused (429). */
        max_streams_per_agent: z.number().int().positive().default(8),
        /** Requests of one agent one replica works on at once; the next wait their turn, unread. */
        max_calls_in_flight_per_agent: z.number().int().positive().default(4),
        /** Requests of one agent that may wait for a turn on one replica; the next is refused (429). */
        max_calls_waiting_per_agent: z.number().int().positive().default(1000),
      })
      .prefault({}),
    tools: z
      .strictObject({
        prefix: z
          .string()
          .regex(/^[a-z][a-z0-9_]*$/, 'lowercase letters, digits and underscores')
          .default('isphere_'),
      })
      .prefault({}),
    approval: z
      .strictObject({
        /** Pending requests expire after this (default 72 h). */
        pending_ttl_s: z
          .number()
          .int()
          .positive()
          .default(72 * 3600),
        /** An approved request must be executed within this (default 24 h). */
        execute_ttl_s: z
          .number()
          .int()
          .positive()
          .default(24 * 3600),
        /** Distinct chairs needed per tool (unprefixed name, e.g. send_file); default 1. */
        required_approvers: z.record(z.string(), z.number().int().min(1).max(5)).default({}),
        /** How often expiry and reconciliation run. */
        maintenance_interval_s: z.number().int().positive().default(30),
        /** How long an idempotency_key is remembered (README: at least 24 h; default 7 days). */
        idempotency_retention_s: z
          .number()
          .int()
          .min(24 * 3600, 'at least 86400 (24 h): an agent may retry a write for a day')
          .default(7 * 24 * 3600),
        /**
         * Refuse message text (and captions) holding invisible or reordering characters at the dry run,
         * as target names and file names always are; by default such text is accepted and flagged.
         */
        refuse_invisible_characters: z.boolean().default(false),
        /**
         * Approval rules (docs/policy.md): who must countersign depends on what is written. Used until a
         * policy is stored in the database with `countersign policy set`, which then applies instead.
         */
        rules: PolicyDoc.prefault({}),
      })
      .prefault({}),
    limits: z
      .strictObject({
        /** Deadline of one tool call; an execution left `executing` longer is reconciled. */
        call_timeout_ms: z.number().int().positive().default(30_000),
        max_message_bytes: z
          .number()
          .int()
          .positive()
          .default(64 * 1024),
      })
      .prefault({}),
    secrets: z
      .strictObject({
        /**
         * The host roots (docs/audit.md, "Host roots"): the master key the keys of sessions, tokens,
         * decisions and cursors are derived from, and the log's pinned origin. One file shared by every
         * replica; default `<data dir>/host-roots.json`, created by the first run.
         */
        host_roots_path: z.string().min(1).optional(),
      })
      .prefault({}),
    audit: z
      .strictObject({
        /** Ed25519 private key (PEM) for checkpoints; default `<data dir>/audit-signing-key.pem`, generated. */
        signing_key_path: z.string().min(1).optional(),
        /** A checkpoint is signed at least this often while rows are written (besides every export). */
        checkpoint_interval_s: z.number().int().positive().default(60),
        /** …or once this many rows follow the last one, whichever comes first. */
        checkpoint_rows: z.number().int().positive().default(1000),
        /**
         * Own rows per source address and reason per minute for refusals of unauthenticated requests
         * (auth.denied, slack.refused, user.login_failed); the rest of the minute's are one
         * auth.denied_summary row with their count.
         */
        denied_rows_per_minute: z.number().int().positive().default(10),
        /**
         * Those refusals answered per source address a second, after a burst of as many: past it each
         * waits its turn before it is answered (src/audit/pace.ts); 0: answered at once.
         */
        refusals_per_second_per_address: z.number().int().min(0).default(100),
        /** Where each checkpoint is also sent, off the box (docs/audit.md#anchors-and-the-signed-head). */
        anchors: z
          .strictObject({
            /** An RFC 3161 time-stamping authority (http or https) that stamps every checkpoint. */
            tsa_url: z.url({ protocol: /^https?$/ }).optional(),
            /** Its certificate, or its CA's (PEM): replies are checked against it when they arrive. */
            tsa_cert_path: z.string().min(1).optional(),
            /** How long the authority may take to answer. */
            tsa_timeout_ms: z.number().int().positive().default(10_000),
            /**
             * How far a token's genTime may lie from its checkpoint's time, in seconds, when tokens are
             * checked (on arrival and by audit verify): a checkpoint is stamped as it is signed.
             */
            tsa_max_skew_s: z.number().int().positive().default(3600),
            /** An append-only directory (another mount) that receives every checkpoint and token. */
            witness_dir: z.string().min(1).optional(),
          })
          .prefault({}),
      })
      .prefault({}),
    web: z
      .strictObject({
        /** A session unused this long ends (default 30 min). */
        session_idle_s: z
          .number()
          .int()
          .positive()
          .default(30 * 60),
        /** A session ends this long after login, used or not (default 12 h). */
        session_absolute_s: z
          .number()
          .int()
          .positive()
          .default(12 * 3600),
        /** Failed logins allowed per user name, and per client address, in 15 minutes. */
        login_failures_per_user: z.number().int().positive().default(5),
        login_failures_per_ip: z.number().int().positive().default(20),
        /** Mark cookies Secure; set when countersign is served behind TLS. */
        secure_cookies: z.boolean().default(false),
        /** Optional: POST a signed notice here for each new approval request. */
        webhook_url: z.url().optional(),
        webhook_secret: z.string().min(16).optional(),
        /** Include the message text in notices (off by default: it may be sensitive). */
        webhook_include_content: z.boolean().default(false),
        /** Single sign-on with an OpenID Connect provider, beside local passwords (docs/identity.md). */
        oidc: OidcSchema.optional(),
      })
      .refine((w) => !w.webhook_url || w.webhook_secret, {
        message: 'webhook_secret is required with webhook_url',
        path: ['webhook_secret'],
      })
      .prefault({}),
    /** Notices of requests, decisions and expiries through the durable outbox. */
    notifications: NotificationsSchema.prefault({}),
    metrics: z
      .strictObject({
        /** Bearer token a scraper must send to read /metrics; without it only loopback clients may. */
        token: z.string().min(16, 'at least 16 characters').optional(),
      })
      .prefault({}),
    /** OpenTelemetry traces over OTLP/HTTP (docs/operations.md, Traces): off unless an endpoint is set. */
    tracing: z
      .strictObject({
        /** The collector's base URL; spans go to `<it>/v1/traces`. */
        otlp_endpoint: z.url({ protocol: /^https?$/ }).optional(),
        /** The full URL spans go to; wins over otlp_endpoint. */
        otlp_traces_endpoint: z.url({ protocol: /^https?$/ }).optional(),
      })
      .prefault({}),
    /** OAuth 2.1 access tokens for agents on HTTP, beside static tokens (docs/identity.md). */
    oauth: OAuthSchema.optional(),
    policy: z
      .strictObject({
        /** Calls per minute per agent, unless the agent has its own limit. */
        rate_limit_per_min: z.number().int().positive().default(60),
        /**
         * RATE_LIMITED answers to one agent a second, after a burst of as many: past it each waits its
         * turn before it is answered (src/audit/pace.ts), so an agent that calls on past its limit as
         * fast as it is answered is slowed to this; 0: answered at once.
         */
        rate_limited_per_second: z.number().int().min(0).default(10),
        /** Where the tool profiles (NAME.json) are; default the profiles/ folder of this package. */
        profiles_dir: z.string().min(1).optional(),
      })
      .prefault({}),
    /** Fault injection for the reliability tests. */
    /** The connector the contract tools use when source_preference is auto. */
    connectors: z
      .strictObject({
        default: z.enum(['local', 'bridge']).default('local'),
      })
      .prefault({}),
    /** An HTTP bridge to a real messenger (docs/bridge.md). */
    bridge: z
      .strictObject({
        url: z.url({ protocol: /^https?$/ }),
        /** Deadline of one bridge request. */
        timeout_ms: z.number().int().positive().default(10_000),
        /** Sent with every request, e.g. {"Authorization": "Bearer …"}. */
        headers: z.record(z.string(), z.string()).default({}),
      })
      .optional(),
    /** Upstream MCP servers whose tools countersign re-exposes, with their writes gated. */
    upstreams: z
      .array(UpstreamSchema)
      .default([])
      .refine((list) => new Set(list.map((u) => u.name)).size === list.length, {
        message: 'upstream names must be unique',
      }),
    files: z
      .strictObject({
        download_dir: z.string().min(1).optional(),
        outbound_dir: z.string().min(1).optional(),
        max_file_bytes: z
          .number()
          .int()
          .positive()
          .default(25 * MiB),
      })
      .prefault({}),
  })
  .refine((c) => c.connectors.default !== 'bridge' || c.bridge, {
    message: 'the bridge connector is the default but bridge.url is not set',
    path: ['bridge', 'url'],
  })
  .superRefine((c, ctx) => {
    if (c.web.oidc && !c.http.public_url && c.http.port === 0) {
      ctx.addIssue({
        code: 'custom',
        message: 'web.oidc builds its redirect URI from http.public_url: set it (http.port is 0)',
        path: ['http', 'public_url'],
      });
    }
    if (c.bridge && c.bridge.timeout_ms >= c.limits.call_timeout_ms) {
      ctx.addIssue({
        code: 'custom',
        message: `must be below limits.call_timeout_ms (${c.limits.call_timeout_ms}) so that a slow bridge answers TIMEOUT`,
        path: ['bridge', 'timeout_ms'],
      });
    }
    for (const [i, u] of c.upstreams.entries()) {
      if (u.timeout_ms !== undefined && u.timeout_ms >= c.limits.call_timeout_ms) {
        ctx.addIssue({
          code: 'custom',
          message: `must be below limits.call_timeout_ms (${c.limits.call_timeout_ms}) so that a slow upstream answers TIMEOUT`,
          path: ['upstreams', i, 'timeout_ms'],
        });
      }
    }
  });

type ParsedConfig = z.infer<typeof ConfigSchema>;

/** The host roots file: as configured (relative to `cwd`), else `<data dir>/host-roots.json`. */
const secretsOf = (parsed: ParsedConfig, cwd: string, dataDir: string) =>
  Object.freeze({
    host_roots_path: path.resolve(cwd, parsed.secrets.host_roots_path ?? path.join(dataDir, HOST_ROOTS_FILE)),
  });

/** The parsed config with every directory made absolute. */
export type Config = Readonly<
  Omit<ParsedConfig, 'files' | 'secrets'> & {
    secrets: Readonly<{ host_roots_path: string }>;
    files: Readonly<{ download_dir: string; outbound_dir: string; max_file_bytes: number }>;
    pglite_dir: string;
  }
>;

type EnvKind = 'string' | 'int' | 'bool' | 'list' | 'map' | 'pairs' | 'roles';

/** Every config key's environment form. Environment wins over the file. */
export const ENV_KEYS: Record<string, { path: string[]; kind: EnvKind }> = {
  COUNTERSIGN_DATA_DIR: { path: ['data_dir'], kind: 'string' },
  COUNTERSIGN_HOST_ROOTS: { path: ['secrets', 'host_roots_path'], kind: 'string' },
  DATABASE_URL: { path: ['database_url'], kind: 'string' },
  COUNTERSIGN_DB_STARTUP_TIMEOUT_S: { path: ['database', 'startup_timeout_s'], kind: 'int' },
  LOG_LEVEL: { path: ['log_level'], kind: 'string' },
  COUNTERSIGN_DEMO: { path: ['demo'], kind: 'bool' },
  COUNTERSIGN_HOST: { path: ['http', 'host'], kind: 'string' },
  COUNTERSIGN_PORT: { path: ['http', 'port'], kind: 'int' },
  COUNTERSIGN_ALLOWED_HOSTS: { path: ['http', 'allowed_hosts'], kind: 'list' },
  COUNTERSIGN_PUBLIC_URL: { path: ['http', 'public_url'], kind: 'string' },
  COUNTERSIGN_MAX_BODY_BYTES: { path: ['http', 'max_body_bytes'], kind: 'int' },
  COUNTERSIGN_MAX_STREAMS_PER_AGENT: { path: ['http', 'max_streams_per_agent'], kind: 'int' },
  COUNTERSIGN_MAX_CALLS_IN_FLIGHT_PER_AGENT: { path: ['http', 'max_calls_in_flight_per_agent'], kind: 'int' },
  COUNTERSIGN_MAX_CALLS_WAITING_PER_AGENT: { path: ['http', 'max_calls_waiting_per_agent'], kind: 'int' },
  COUNTERSIGN_TOOLS_PREFIX: { path: ['tools', 'prefix'], kind: 'string' },
  COUNTERSIGN_DOWNLOAD_DIR: { path: ['files', 'download_dir'], kind: 'string' },
  COUNTERSIGN_OUTBOUND_DIR: { path: ['files', 'outbound_dir'], kind: 'string' },
  COUNTERSIGN_MAX_FILE_BYTES: { path: ['files', 'max_file_bytes'], kind: 'int' },
  COUNTERSIGN_PENDING_TTL_S: { path: ['approval', 'pending_ttl_s'], kind: 'int' },
  COUNTERSIGN_REFUSE_INVISIBLE_CHARACTERS: {
    path: ['approval', 'refuse_invisible_characters'],
    kind: 'bool',
  },
  COUNTERSIGN_EXECUTE_TTL_S: { path: ['approval', 'execute_ttl_s'], kind: 'int' },
  COUNTERSIGN_REQUIRED_APPROVERS: { path: ['approval', 'required_approvers'], kind: 'map' },
  COUNTERSIGN_MAINTENANCE_INTERVAL_S: { path: ['approval', 'maintenance_interval_s'], kind: 'int' },
  COUNTERSIGN_IDEMPOTENCY_RETENTION_S: { path: ['approval', 'idempotency_retention_s'], kind: 'int' },
  COUNTERSIGN_CALL_TIMEOUT_MS: { path: ['limits', 'call_timeout_ms'], kind: 'int' },
  COUNTERSIGN_MAX_MESSAGE_BYTES: { path: ['limits', 'max_message_bytes'], kind: 'int' },
  COUNTERSIGN_RATE_LIMIT_PER_MIN: { path: ['policy', 'rate_limit_per_min'], kind: 'int' },
  COUNTERSIGN_RATE_LIMITED_PER_SECOND: { path: ['policy', 'rate_limited_per_second'], kind: 'int' },
  COUNTERSIGN_PROFILES_DIR: { path: ['policy', 'profiles_dir'], kind: 'string' },
  COUNTERSIGN_AUDIT_SIGNING_KEY: { path: ['audit', 'signing_key_path'], kind: 'string' },
  COUNTERSIGN_CHECKPOINT_INTERVAL_S: { path: ['audit', 'checkpoint_interval_s'], kind: 'int' },
  COUNTERSIGN_TSA_URL: { path: ['audit', 'anchors', 'tsa_url'], kind: 'string' },
  COUNTERSIGN_TSA_CERT: { path: ['audit', 'anchors', 'tsa_cert_path'], kind: 'string' },
  COUNTERSIGN_TSA_TIMEOUT_MS: { path: ['audit', 'anchors', 'tsa_timeout_ms'], kind: 'int' },
  COUNTERSIGN_TSA_MAX_SKEW_S: { path: ['audit', 'anchors', 'tsa_max_skew_s'], kind: 'int' },
  COUNTERSIGN_WITNESS_DIR: { path: ['audit', 'anchors', 'witness_dir'], kind: 'string' },
  COUNTERSIGN_CHECKPOINT_ROWS: { path: ['audit', 'checkpoint_rows'], kind: 'int' },
  COUNTERSIGN_DENIED_ROWS_PER_MINUTE: { path: ['audit', 'denied_rows_per_minute'], kind: 'int' },
  COUNTERSIGN_REFUSALS_PER_SECOND: { path: ['audit', 'refusals_per_second_per_address'], kind: 'int' },
  COUNTERSIGN_SESSION_IDLE_S: { path: ['web', 'session_idle_s'], kind: 'int' },
  COUNTERSIGN_SESSION_ABSOLUTE_S: { path: ['web', 'session_absolute_s'], kind: 'int' },
  COUNTERSIGN_LOGIN_FAILURES_PER_USER: { path: ['web', 'login_failures_per_user'], kind: 'int' },
  COUNTERSIGN_LOGIN_FAILURES_PER_IP: { path: ['web', 'login_failures_per_ip'], kind: 'int' },
  COUNTERSIGN_SECURE_COOKIES: { path: ['web', 'secure_cookies'], kind: 'bool' },
  COUNTERSIGN_WEBHOOK_URL: { path: ['web', 'webhook_url'], kind: 'string' },
  COUNTERSIGN_WEBHOOK_SECRET: { path: ['web', 'webhook_secret'], kind: 'string' },
  COUNTERSIGN_WEBHOOK_INCLUDE_CONTENT: { path: ['web', 'webhook_include_content'], kind: 'bool' },
  COUNTERSIGN_OIDC_ISSUER: { path: ['web', 'oidc', 'issuer'], kind: 'string' },
  COUNTERSIGN_OIDC_CLIENT_ID: { path: ['web', 'oidc', 'client_id'], kind: 'string' },
  COUNTERSIGN_OIDC_CLIENT_SECRET: { path: ['web', 'oidc', 'client_secret'], kind: 'string' },
  COUNTERSIGN_OIDC_TOKEN_AUTH_METHOD: { path: ['web', 'oidc', 'token_endpoint_auth_method'], kind: 'string' },
  COUNTERSIGN_OIDC_REDIRECT_PATH: { path: ['web', 'oidc', 'redirect_path'], kind: 'string' },
  COUNTERSIGN_OIDC_SCOPES: { path: ['web', 'oidc', 'scopes'], kind: 'list' },
  COUNTERSIGN_OIDC_LABEL: { path: ['web', 'oidc', 'label'], kind: 'string' },
  COUNTERSIGN_OIDC_USERNAME_CLAIMS: { path: ['web', 'oidc', 'username_claims'], kind: 'list' },
  COUNTERSIGN_OIDC_ROLE_CLAIM: { path: ['web', 'oidc', 'role_claim'], kind: 'string' },
  COUNTERSIGN_OIDC_ROLES: { path: ['web', 'oidc', 'roles'], kind: 'roles' },
  COUNTERSIGN_NOTIFY_EVENTS: { path: ['notifications', 'events'], kind: 'list' },
  COUNTERSIGN_NOTIFY_RETRY_HORIZON_S: { path: ['notifications', 'retry_horizon_s'], kind: 'int' },
  COUNTERSIGN_NOTIFY_BACKOFF_MS: { path: ['notifications', 'backoff_initial_ms'], kind: 'int' },
  COUNTERSIGN_NOTIFY_BACKOFF_MAX_MS: { path: ['notifications', 'backoff_max_ms'], kind: 'int' },
  COUNTERSIGN_NOTIFY_POLL_MS: { path: ['notifications', 'poll_interval_ms'], kind: 'int' },
  COUNTERSIGN_NOTIFY_TIMEOUT_MS: { path: ['notifications', 'send_timeout_ms'], kind: 'int' },
  COUNTERSIGN_SMTP_URL: { path: ['notifications', 'email', 'smtp_url'], kind: 'string' },
  COUNTERSIGN_SMTP_HOST: { path: ['notifications', 'email', 'host'], kind: 'string' },
  COUNTERSIGN_SMTP_PORT: { path: ['notifications', 'email', 'port'], kind: 'int' },
  COUNTERSIGN_SMTP_SECURE: { path: ['notifications', 'email', 'secure'], kind: 'bool' },
  COUNTERSIGN_SMTP_USER: { path: ['notifications', 'email', 'user'], kind: 'string' },
  COUNTERSIGN_SMTP_PASSWORD: { path: ['notifications', 'email', 'password'], kind: 'string' },
  COUNTERSIGN_EMAIL_FROM: { path: ['notifications', 'email', 'from'], kind: 'string' },
  COUNTERSIGN_EMAIL_TO: { path: ['notifications', 'email', 'to'], kind: 'list' },
  COUNTERSIGN_SLACK_BOT_TOKEN: { path: ['notifications', 'slack', 'bot_token'], kind: 'string' },
  COUNTERSIGN_SLACK_SIGNING_SECRET: { path: ['notifications', 'slack', 'signing_secret'], kind: 'string' },
  COUNTERSIGN_SLACK_CHANNEL: { path: ['notifications', 'slack', 'channel'], kind: 'string' },
  COUNTERSIGN_SLACK_API_BASE_URL: { path: ['notifications', 'slack', 'api_base_url'], kind: 'string' },
  COUNTERSIGN_SLACK_USERS: { path: ['notifications', 'slack', 'users'], kind: 'pairs' },
  COUNTERSIGN_DEFAULT_SOURCE: { path: ['connectors', 'default'], kind: 'string' },
  COUNTERSIGN_METRICS_TOKEN: { path: ['metrics', 'token'], kind: 'string' },
  COUNTERSIGN_BRIDGE_URL: { path: ['bridge', 'url'], kind: 'string' },
  COUNTERSIGN_BRIDGE_TIMEOUT_MS: { path: ['bridge', 'timeout_ms'], kind: 'int' },
  // OpenTelemetry's own names, so that a collector set up for other services needs nothing new.
  OTEL_EXPORTER_OTLP_ENDPOINT: { path: ['tracing', 'otlp_endpoint'], kind: 'string' },
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: { path: ['tracing', 'otlp_traces_endpoint'], kind: 'string' },
  COUNTERSIGN_OAUTH_ISSUER: { path: ['oauth', 'issuer'], kind: 'string' },
  COUNTERSIGN_OAUTH_JWKS_URI: { path: ['oauth', 'jwks_uri'], kind: 'string' },
  COUNTERSIGN_OAUTH_AUDIENCE: { path: ['oauth', 'audience'], kind: 'string' },
  COUNTERSIGN_OAUTH_AGENT_CLAIM: { path: ['oauth', 'agent_claim'], kind: 'string' },
  COUNTERSIGN_OAUTH_AGENTS: { path: ['oauth', 'agents'], kind: 'pairs' },
  COUNTERSIGN_OAUTH_SCOPES: { path: ['oauth', 'scopes_supported'], kind: 'list' },
  COUNTERSIGN_OAUTH_CLOCK_TOLERANCE_S: { path: ['oauth', 'clock_tolerance_s'], kind: 'int' },
};

/** The base of links people follow (review pages): http.public_url, else this server's own address. */
export const publicBaseUrl = (config: Pick<Config, 'http'>) =>
  config.http.public_url ?? `http://${config.http.host}:${config.http.port}`;

/** A configuration that cannot be used: named by key (and env variable), refused before anything starts. */
export const configError = (message: string) => new AppError('CONFIG_INVALID', message, 'config');

function envValue(name: string, raw: string, kind: EnvKind): unknown {
  switch (kind) {
    case 'string':
      return raw;
    case 'list':
      return raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
    case 'map': {
      // tool=n,tool=n
      const entries = raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
        .map((pair) => {
          const m = /^([a-z0-9_]+)=(\d+)$/.exec(pair);
          if (!m) throw configError(`${name}: expected tool=number pairs separated by commas, got "${pair}"`);
          return [m[1]!, Number(m[2])] as const;
        });
      return Object.fromEntries(entries);
    }
    case 'pairs': {
      // value=name,value=name (OAuth claim value → agent name); a value may hold anything but , and =
      const entries = raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
        .map((pair) => {
          const m = /^([^=]+)=([^=]+)$/.exec(pair);
          if (!m) throw configError(`${name}: expected value=name pairs separated by commas, got "${pair}"`);
          return [m[1]!.trim(), m[2]!.trim()] as const;
        });
      return Object.fromEntries(entries);
    }
    case 'roles': {
      // value=role+role,value=role (OpenID claim value → roles); a value may hold anything but , and =
      const entries = raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
        .map((pair) => {
          const m = /^([^=]+)=([a-z+]+)$/.exec(pair);
          if (!m)
            throw configError(`${name}: expected value=role+role pairs separated by commas, got "${pair}"`);
          return [m[1]!.trim(), m[2]!.split('+')] as const;
        });
      return Object.fromEntries(entries);
    }
    case 'int':
      if (!/^-?\d+$/.test(raw.trim())) throw configError(`${name}: expected an integer, got "${raw}"`);
      return Number(raw);
    case 'bool':
      if (/^(1|true|yes|on)$/i.test(raw)) return true;
      if (/^(0|false|no|off)$/i.test(raw)) return false;
      throw configError(`${name}: expected true or false, got "${raw}"`);
  }
}

function setPath(target: Record<string, unknown>, keys: string[], value: unknown): void {
  let node = target;
  for (const key of keys.slice(0, -1)) {
    const next = node[key];
    if (typeof next !== 'object' || next === null || Array.isArray(next)) node[key] = {};
    node = node[key] as Record<string, unknown>;
  }
  node[keys.at(-1)!] = value;
}

function readFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw configError(`cannot read config file ${file}: ${(err as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw configError(`config file ${file} is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw configError(`config file ${file} must hold a JSON object`);
  }
  return parsed as Record<string, unknown>;
}

function envNameFor(keyPath: PropertyKey[]): string | undefined {
  const dotted = keyPath.join('.');
  return Object.entries(ENV_KEYS).find(([, spec]) => spec.path.join('.') === dotted)?.[0];
}

/**
 * A key's value from the environment, or from the file its `<NAME>_FILE` variable names (a mounted
 * secret: the content, one trailing newline dropped). Both set is refused, so that neither silently wins.
 */
function envOrFile(env: Record<string, string | undefined>, name: string, cwd: string): string | undefined {
  const fileVar = `${name}_FILE`;
  const file = env[fileVar];
  if (file === undefined || file === '') return env[name];
  if (env[name] !== undefined && env[name] !== '') {
    throw configError(
      `${name} and ${fileVar} are both set: give the value or the file that holds it, not both`,
    );
  }
  let value: string;
  try {
    value = fs.readFileSync(path.resolve(cwd, file), 'utf8').replace(/\r?\n$/, '');
  } catch (err) {
    throw configError(
      `${fileVar}: cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
    );
  }
  // An empty file is a secret not filled in (a placeholder left in a manifest), never "unset".
  if (value === '') throw configError(`${fileVar}: ${file} is empty`);
  return value;
}

const frozenApproval = (approval: z.output<typeof ConfigSchema>['approval']) =>
  Object.freeze({
    ...approval,
    required_approvers: Object.freeze({ ...approval.required_approvers }),
    rules: Object.freeze({
      ...approval.rules,
      rules: Object.freeze(approval.rules.rules.map(Object.freeze)),
    }),
  });

/**
 * Builds the frozen config from an optional JSON file and the environment.
 * `env` and `cwd` are parameters so that only the CLI touches process globals.
 */
export function loadConfig(env: Record<string, string | undefined>, cwd: string): Config {
  const explicit = env.COUNTERSIGN_CONFIG;
  const file = explicit ? path.resolve(cwd, explicit) : path.join(cwd, 'countersign.config.json');
  const input: Record<string, unknown> = explicit || fs.existsSync(file) ? readFile(file) : {};

  for (const [name, spec] of Object.entries(ENV_KEYS)) {
    const raw = envOrFile(env, name, cwd);
    if (raw !== undefined && raw !== '') setPath(input, spec.path, envValue(name, raw, spec.kind));
  }

  const result = ConfigSchema.safeParse(input);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    const key = issue.path.join('.') || '(root)';
    const envName = envNameFor(issue.path);
    throw configError(`config key "${key}"${envName ? ` (env ${envName})` : ''}: ${issue.message}`);
  }

  const parsed = result.data;
  const dataDir = path.resolve(cwd, parsed.data_dir);
  return Object.freeze({
    ...parsed,
    data_dir: dataDir,
    pglite_dir: path.join(dataDir, 'pglite'),
    secrets: secretsOf(parsed, cwd, dataDir),
    http: Object.freeze({ ...parsed.http, allowed_hosts: Object.freeze([...parsed.http.allowed_hosts]) }),
    tools: Object.freeze(parsed.tools),
    approval: frozenApproval(parsed.approval),
    limits: Object.freeze(parsed.limits),
    policy: Object.freeze(parsed.policy),
    web: Object.freeze({
      ...parsed.web,
      oidc:
        parsed.web.oidc &&
        Object.freeze({
          ...parsed.web.oidc,
          scopes: Object.freeze([...parsed.web.oidc.scopes]),
          username_claims: Object.freeze([...parsed.web.oidc.username_claims]),
          roles: Object.freeze({ ...parsed.web.oidc.roles }),
        }),
    }),
    metrics: Object.freeze(parsed.metrics),
    notifications: Object.freeze({
      ...parsed.notifications,
      events: Object.freeze([...parsed.notifications.events]),
      email:
        parsed.notifications.email &&
        Object.freeze({
          ...parsed.notifications.email,
          to: Object.freeze([...parsed.notifications.email.to]),
        }),
      slack:
        parsed.notifications.slack &&
        Object.freeze({
          ...parsed.notifications.slack,
          users: Object.freeze({ ...parsed.notifications.slack.users }),
        }),
    }),
    tracing: Object.freeze(parsed.tracing),
    oauth:
      parsed.oauth && Object.freeze({ ...parsed.oauth, agents: Object.freeze({ ...parsed.oauth.agents }) }),
    audit: Object.freeze({
      ...parsed.audit,
      anchors: Object.freeze({
        ...parsed.audit.anchors,
        tsa_cert_path:
          parsed.audit.anchors.tsa_cert_path && path.resolve(cwd, parsed.audit.anchors.tsa_cert_path),
        witness_dir: parsed.audit.anchors.witness_dir && path.resolve(cwd, parsed.audit.anchors.witness_dir),
      }),
    }),
    connectors: Object.freeze(parsed.connectors),
    bridge:
      parsed.bridge && Object.freeze({ ...parsed.bridge, headers: Object.freeze(parsed.bridge.headers) }),
    upstreams: Object.freeze(parsed.upstreams.map((u) => Object.freeze(u))),
    files: Object.freeze({
      download_dir: path.resolve(cwd, parsed.files.download_dir ?? path.join(dataDir, 'downloads')),
      outbound_dir: path.resolve(cwd, parsed.files.outbound_dir ?? path.join(dataDir, 'outbound')),
      max_file_bytes: parsed.files.max_file_bytes,
    }),
  }) as Config;
}
