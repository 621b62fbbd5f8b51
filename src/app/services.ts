import type { AdminDeps } from '../admin/commands.ts';
import type { FirstRun } from '../admin/first-run.ts';
import type { Approvals } from '../approval/index.ts';
import type { Authenticate, OAuthAgents, SessionStore, SignIn, UserDirectory } from '../accounts/index.ts';
import {
  createCheckpointer,
  type AuditLog,
  type AuditReader,
  type Checkpointer,
  type ExportRecords,
  type Refusals,
} from '../audit/index.ts';
import type { ClusterBus } from '../cluster/bus.ts';
import type { Leadership } from '../cluster/leadership.ts';
import type { Config } from '../config.ts';
import type { BlobStore, Upstream } from '../connectors/index.ts';
import type { Faults } from '../core/faults.ts';
import type { Connection, Dialect } from '../db/knex.ts';
import type { Logger } from '../log.ts';
import type { SlackStore } from '../notify/index.ts';
import type { CallPipeline, Metrics } from '../server/index.ts';
import type { StopReason, Transport } from './lifecycle.ts';
import { agentAuth } from './services/agent-auth.ts';
import { approvals, patterns } from './services/approvals.ts';
import { audit } from './services/audit.ts';
import { cluster } from './services/cluster.ts';
import { connectors } from './services/connectors.ts';
import { lifecycle } from './services/lifecycle.ts';
import { limits } from './services/limits.ts';
import { notifications } from './services/notifications.ts';
import { adminEndpoint, firstRun, operator } from './services/operator.ts';
import { pages } from './services/pages.ts';
import { checkOrder, type AnyServiceFactory, type Closers, type Parts } from './services/parts.ts';
import { periodic } from './services/periodic.ts';
import { cursors, memory, metrics, pipeline, profiles } from './services/pipeline.ts';
import { blobs, storage } from './services/storage.ts';
import { tracing } from './services/tracing.ts';
import { pins, upstreams } from './services/upstreams.ts';

export { upstreamTimeoutMs } from './services/upstreams.ts';

/** Everything a transport needs, built once per process. */
export interface Services {
  config: Config;
  log: Logger;
  /**
   * Which database this process runs on. The query builder itself is not here: the transports get
   * stores, and nothing handed to them can run SQL of its own.
   */
  dialect: Dialect;
  audit: AuditLog;
  /** Refusals of unauthenticated requests: a few rows per source and reason a minute, the rest summed. */
  refusals: Refusals;
  blobs: BlobStore;
  approvals: Approvals;
  /** The stores the operator's commands run on (the admin endpoint, the web account pages, the first run). */
  admin: AdminDeps;
  /** Checkpoints and exports, with their origin and signer (the database stays inside the operations). */
  checkpoints: Checkpointer;
  pipeline: CallPipeline;
  /** Upstream MCP servers (config `upstreams`), each reconnecting on its own. */
  upstreams: readonly Upstream[];
  metrics: Metrics;
  /** Change events shared by the replicas of a cluster (in-process on PGlite). */
  bus: ClusterBus;
  /** Whether this replica runs the cluster's periodic work. */
  leadership: Leadership;
  /** Token → agent, cached while the cluster bus announces agent changes. */
  authenticate: Authenticate;
  /** OAuth access tokens for agents on HTTP, when `oauth` is configured. */
  oauth?: OAuthAgents;
  startedAt: Date;
  /** The people's web sessions (accounts'). */
  sessions: SessionStore;
  /** Who an outside identity (a Slack user) is among the active users (accounts'). */
  people: UserDirectory;
  /** The Slack app's messages and signed callbacks seen (notify's): a replay is refused on every replica. */
  slackStore: SlackStore;
  /** The audit log as the compliance pages read it, and the exports they record (audit's). */
  auditReader: AuditReader;
  auditExports: ExportRecords;
  /** Password and single sign-on sign-ins, under the per-user and per-address limits (accounts'). */
  signIn: SignIn;
  /**
   * Tells the services where this process serves the web form (used for links unless http.public_url is
   * set). Until then, and for good in a stdio server without one, review links are null and the dry run
   * names the CLI command that approves instead.
   */
  listeningAt(url: string): void;
  /** Appends server.started, once the transport serves; close() then appends server.stopped. */
  recordStart(transport: Transport): Promise<void>;
  /** Runs expiry and reconciliation once (also done periodically, by the cluster's leader). */
  maintain(): Promise<void>;
  /** Set until the first run's credentials have been shown: credentials to show, then mark shown. */
  firstRun?: FirstRun;
  /** Appends server.stopped (after a recorded start), then closes everything; later calls wait for the first. */
  close(reason?: StopReason): Promise<void>;
}

/** Set by tests only; production wiring passes none. */
export interface ServiceOptions {
  /** Crashes and stalls at named points (test/helpers/faults.ts). */
  faults?: Faults;
  /**
   * Given the database once it is open and migrated: the view of an administrator with SQL, through
   * which a test inspects stored state or tampers with it as the insider of docs/audit.md ("Threat
   * model") would. test/helpers/server.ts keeps it as the server's `sql`; the services keep nothing
   * of it that a transport could reach.
   */
  onDatabase?(knex: Connection): void;
}

/** The parts openServices is given; every other part is a factory's. */
export const GIVEN = [
  'config',
  'log',
  'command',
  'faults',
  'onDatabase',
] as const satisfies readonly (keyof Parts)[];

/**
 * The services, in the order they open (each factory in src/app/services/): a factory comes after every
 * part it needs. They close in the reverse order of the closers they register: the admin endpoint and
 * the periodic work first, the audit log's drain, then tracing, then the database last.
 */
export const SERVICES: readonly AnyServiceFactory[] = [
  profiles,
  storage,
  tracing,
  blobs,
  audit,
  cluster,
  notifications,
  lifecycle,
  limits,
  connectors,
  cursors,
  patterns,
  approvals,
  memory,
  metrics,
  pins,
  upstreams,
  pipeline,
  periodic,
  operator,
  firstRun,
  adminEndpoint,
  agentAuth,
  pages,
];

/** The parts `Services` is shaped from, all of them provided by the end of the list. */
export const SHAPED = [
  ...['config', 'log', 'db', 'audit', 'lifecycle', 'blobs', 'approvals', 'admin', 'checkpoints', 'bus'],
  ...['leadership', 'pipeline', 'upstreams', 'metrics', 'authenticate', 'oauth', 'signIn', 'auditReader'],
  ...['auditExports', 'sessions', 'people', 'slackStore', 'maintain', 'firstRun'],
] as const satisfies readonly (keyof Parts)[];

export async function openServices(
  config: Config,
  log: Logger,
  command: string,
  options: ServiceOptions = {},
): Promise<Services> {
  const { have, closeAll } = await assemble(
    SERVICES,
    { config, log, command, faults: options.faults, onDatabase: options.onDatabase },
    SHAPED,
  );
  // assemble refused the list unless every part in SHAPED is provided by then.
  return shape(have as Pick<Parts, (typeof SHAPED)[number]>, closeAll);
}

/**
 * Opens each factory in turn with the parts it needs (only those), and keeps the parts it provides. On
 * a failure, what was opened closes in reverse order and the failure is thrown again. A list in which a
 * factory comes before a part it needs, or that ends without a part of `last`, is refused before
 * anything opens. Returns the parts and the closing of everything opened (once).
 */
export async function assemble(
  factories: readonly AnyServiceFactory[],
  given: Pick<Parts, (typeof GIVEN)[number]>,
  last: readonly (keyof Parts)[] = [],
): Promise<{ have: Partial<Parts>; closeAll: () => Promise<void> }> {
  checkOrder(factories, Object.keys(given) as (keyof Parts)[], last);
  const closers: Closers = [];
  const closeAll = async () => {
    for (const close of closers.reverse())
      await close().catch((err) => given.log.error({ err }, 'close failed'));
  };
  const have: Partial<Parts> = { ...given };
  try {
    for (const factory of factories) {
      // Only what the factory declares: a part it did not ask for is not there to be used.
      const needs = Object.fromEntries(factory.needs.map((n) => [n, have[n]])) as Partial<Parts>;
      const made = await factory.open(needs, closers);
      for (const p of factory.provides) if (p in made) Object.assign(have, { [p]: made[p] });
    }
  } catch (err) {
    await closeAll();
    throw err;
  }
  return { have, closeAll };
}

/** The services as the transports see them. */
function shape(have: Pick<Parts, (typeof SHAPED)[number]>, closeAll: () => Promise<void>): Services {
  const { db, lifecycle, checkpoints, bus, leadership, authenticate, oauth } = have;
  return {
    config: have.config,
    log: have.log,
    dialect: db.dialect,
    audit: have.audit,
    refusals: lifecycle.refusals,
    blobs: have.blobs,
    approvals: have.approvals,
    admin: have.admin,
    ...{ checkpoints: createCheckpointer(checkpoints), bus, leadership },
    pipeline: have.pipeline,
    upstreams: have.upstreams,
    metrics: have.metrics,
    ...(oauth ? { authenticate, oauth } : { authenticate }),
    startedAt: lifecycle.startedAt,
    ...{ signIn: have.signIn, auditReader: have.auditReader, auditExports: have.auditExports },
    ...{ sessions: have.sessions, people: have.people, slackStore: have.slackStore },
    maintain: have.maintain,
    listeningAt: lifecycle.listeningAt,
    recordStart: lifecycle.recordStart,
    firstRun: have.firstRun,
    close: (reason) => lifecycle.close(reason, closeAll),
  };
}
