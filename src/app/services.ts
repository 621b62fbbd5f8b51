import path from 'node:path';
import type { Knex } from 'knex';
import { startAdminEndpoint } from '../admin/endpoint.ts';
import { assertWritableDataDir } from './data-dir.ts';
import { firstRun as seedFirstRun, type FirstRun, type FirstRunDeps } from '../admin/first-run.ts';
import type { AdminDeps } from '../admin/commands.ts';
import { adminDeps } from './admin-deps.ts';
import {
  createApprovals,
  createPatternPool,
  sealUnsealedPolicy,
  TASK_POLL_INTERVAL_MS,
  type Approvals,
  WRITE_FENCE,
} from '../approval/index.ts';
import {
  createAuditLog,
  type AuditLog,
  createRefusals,
  createPace,
  type Refusals,
  checkpointDeps,
  checkpointTick,
  type CheckpointDeps,
  createCheckpointer,
  type Checkpointer,
  createAuditReader,
  type AuditReader,
  createExportRecords,
  type ExportRecords,
  headSeq,
} from '../audit/index.ts';
import { publicBaseUrl, type Config } from '../config.ts';
import { createConnectorSet, directoryLookalikes } from '../connectors/index.ts';
import {
  createBridgeConnector,
  createBlobStore,
  type BlobStore,
  createLocalConnector,
  fillNameSkeletons,
  connectUpstream,
  type Upstream,
  createUpstreamPins,
  type UpstreamPins,
} from '../connectors/index.ts';
import type { Database, Dialect } from '../db/knex.ts';
import { openWhenReady } from '../db/ready.ts';
import { describePgError } from '../admin/pg-errors.ts';
import { hostRootsOf, openHostRoots, type OpenedRoots } from '../db/host-roots.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { migrateLatest, upToDate } from '../db/migrations.ts';
import type { Faults } from '../core/faults.ts';
import { withSpans, type Tracer } from '../core/tracing.ts';
import type { Logger } from '../log.ts';
import { builtinTools, createCursorCodec, type MemoryStore } from '../tools/index.ts';
import { createSlackStore, startNotifications, type SlackStore } from '../notify/index.ts';
import { createLocalBus, createPgBus, type ClusterBus } from '../cluster/bus.ts';
import { createLeadership, soleLeader, type Leadership } from '../cluster/leadership.ts';
import { assertClusterSigningKey } from '../cluster/signing-key.ts';
import {
  createAgentAuth,
  sealUnsealedRecords,
  storedTokenHashes,
  createAgentMemory,
  createSessionStore,
  type SessionStore,
  createUserDirectory,
  type UserDirectory,
  createSignIn,
  type SignIn,
  createOAuthAgentAuth,
  type Authenticate,
  type OAuthAgents,
  createOAuthVerifier,
  createMemoryRateLimiter,
  createRateLimiter,
  agentById,
  agentSealed,
} from '../accounts/index.ts';
import { loadProfiles } from '../core/profiles.ts';
import {
  createCallPipeline,
  createMetrics,
  startTaskRunner,
  tracesUrl,
  type CallPipeline,
  type Metrics,
  type WaitAccount,
} from '../server/index.ts';
import { VERSION } from '../core/version.ts';
import { startedRow, stoppedRow, type StopReason, type Transport } from './lifecycle.ts';

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

/** How long start-up waits for upstreams' first connection. */
const UPSTREAM_START_WAIT_MS = 10_000;

/** An upstream call's own deadline stays inside the call's, so that a slow upstream answers TIMEOUT. */
export const upstreamTimeoutMs = (config: Pick<Config, 'limits'>) =>
  Math.max(100, Math.floor(config.limits.call_timeout_ms * 0.9));

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
  onDatabase?(knex: Knex): void;
}

/** Clean-up steps, run in reverse order of registration; a failing one is logged and the rest still run. */
type Closers = (() => Promise<void>)[];

export async function openServices(
  config: Config,
  log: Logger,
  command: string,
  options: ServiceOptions = {},
): Promise<Services> {
  // A profile that breaks the rules is known before any wait for the database.
  const profiles = loadProfiles(config.policy.profiles_dir);
  await options.faults?.at('before_database');
  const { db, opened } = await openStorage(config, log, command);
  options.onDatabase?.(db.knex);
  const closers: Closers = [() => db.close()];
  const roots = () => Promise.resolve(opened.roots);
  const closeAll = async () => {
    for (const close of closers.reverse()) await close().catch((err) => log.error({ err }, 'close failed'));
  };
  try {
    const tracer = await openTracing(config, closers);
    const blobs = createBlobStore(path.join(config.data_dir, 'blobs'));
    const audit = createAuditLog(db.knex, { roots });
    closers.push(() => audit.drain());
    const cluster = await joinCluster({ db, audit, config, log, opened }, closers);
    // Notices go out from the outbox on the leader's own loop; a change only queues them (docs/notifications.md).
    const notifications = startNotifications({ knex: db.knex, audit, config, log }, cluster.leadership);
    if (notifications) closers.push(() => notifications.close());
    const lifecycle = createLifecycle({ config, log, audit, db, signer: cluster.checkpoints.signer });
    // On the embedded database one process counts every call: in memory, without a statement each.
    const limiter = config.database_url ? createRateLimiter(db.knex) : createMemoryRateLimiter();
    const rateLimitedPace = paceUntilStop(config.policy.rate_limited_per_second, closers);
    const { local, bridge, connectors } = await openConnectors(db, blobs, config, log, tracer);
    const cursors = createCursorCodec(opened.roots.key('cursor').toString('base64url'));
    // The rules' long matches run on worker threads, stopped with the server (approval/rules/pattern-pool.ts).
    const patterns = closing(createPatternPool(), closers);
    const approvals = openApprovals(tracer, {
      ...{ knex: db.knex, audit, config, roots, patterns },
      ...{ reviewUrl: lifecycle.reviewUrl, onQueued: notifications?.kick },
    });
    const memory = createAgentMemory(db.knex) satisfies MemoryStore;
    const metrics = createMetrics();
    metrics.waits.watch(db.knex.on('query', () => metrics.statement()));
    const pins = createUpstreamPins({ knex: db.knex, audit, log });
    const upstreams = await connectUpstreams(config, log, cluster.bus, pins, closers, metrics.waits);
    const pipeline = createCallPipeline({
      ...{ tools: builtinTools, upstreams, memory, limiter, rateLimitedPace, profiles, metrics, audit },
      ...{ connectors, cursors, approvals, blobs, config, log, faults: options.faults, tracer },
    });
    const { maintain, pokeTasks } = await startPeriodicWork(
      { approvals, local, bridge, memory, limiter, pipeline, knex: db.knex, ...cluster },
      cluster.leadership,
      config,
      log,
      closers,
    );
    const stores = { knex: db.knex, blobs, config, audit, roots, patterns };
    const admin = operatorStores(stores, { ...cluster, upstreams, pokeTasks });
    // The first run's accounts exist before a command can reach the embedded database through this process.
    const firstRun = await firstRunOf(admin, options);
    if (db.dialect === 'pglite') closers.push(await startAdmin(admin, log));

    return {
      config,
      log,
      dialect: db.dialect,
      audit,
      refusals: lifecycle.refusals,
      blobs,
      approvals,
      admin,
      ...{ ...cluster, checkpoints: createCheckpointer(cluster.checkpoints) },
      pipeline,
      upstreams,
      metrics,
      ...agentAuth(config, log, db.knex, cluster.bus, lifecycle.baseUrl),
      startedAt: lifecycle.startedAt,
      ...pageStores(db.knex, audit, config, opened.roots),
      maintain,
      listeningAt: lifecycle.listeningAt,
      recordStart: lifecycle.recordStart,
      firstRun,
      close: (reason) => lifecycle.close(reason, closeAll),
    };
  } catch (err) {
    await closeAll();
    throw err;
  }
}

/**
 * The loopback endpoint through which CLI commands reach the embedded database this process holds. An
 * accepted upstream pin applies here once the command has committed: the upstreams are listed again.
 */

/**
 * The operator's commands' stores in this process. A command's change to an agent drops it from this
 * replica's cache at once (a revoked or rotated agent's open listen streams close: server/streams.ts);
 * an accepted upstream pin is applied here before the command answers; a request a command approves
 * pokes this process's task runner.
 */
function operatorStores(
  db: Parameters<typeof adminDeps>[0],
  { bus, upstreams, pokeTasks }: { bus: ClusterBus; upstreams: readonly Upstream[]; pokeTasks: () => void },
) {
  return adminDeps(db, {
    agentChanged: (id) => bus.agentChangedHere(id),
    taskApproved: pokeTasks,
    upstreamsChanged: async () => {
      await Promise.all(upstreams.map((u) => u.refresh()));
    },
  });
}

async function startAdmin(deps: AdminDeps, log: Logger) {
  const admin = await startAdminEndpoint({ ...deps, dataDir: deps.config.data_dir, log });
  return () => admin.close();
}

/** The database, migrated, and the host roots (made by the first start: docs/audit.md, "Host roots"). */
async function openStorage(config: Config, log: Logger, command: string) {
  const db = await openMigrated(config, log, command);
  try {
    const tokenHashes = () => storedTokenHashes(db.knex);
    const head = (q?: Knex | Knex.Transaction) => headSeq(q ?? db.knex);
    return {
      db,
      opened: await openHostRoots(
        db.knex,
        config.secrets.host_roots_path,
        log,
        tokenHashes,
        head,
        sealUnsealedRecords,
        sealUnsealedPolicy,
      ),
    };
  } catch (err) {
    await db.close();
    throw err;
  }
}

/**
 * The database, opened and migrated; a PostgreSQL that is not ready yet is tried again for up to
 * database.startup_timeout_s (openWhenReady). A data directory that cannot be written is refused first.
 */
function openMigrated(config: Config, log: Logger, command: string): Promise<Database> {
  assertWritableDataDir(config.data_dir);
  return openWhenReady({
    ...{ url: config.database_url, pgliteDir: config.pglite_dir, command, log },
    timeoutMs: config.database.startup_timeout_s * 1000,
    explain: (err) => describePgError(err, config.database_url),
    check: (opened) => upToDate(opened.knex),
    async prepare(opened) {
      const applied = await migrateLatest(opened.knex);
      if (applied.length === 0) return;
      // A new database takes every migration: the count and the newest, not a line listing forty names.
      log.info({ count: applied.length, latest: applied.at(-1) }, 'migrations applied');
      log.debug({ applied }, 'migrations applied, by name');
    },
  });
}

/**
 * Static agent tokens, and OAuth access tokens when `oauth` is configured. OAuth tokens must name this
 * server's resource URL: `oauth.audience`, else `<base>/mcp`, the base being http.public_url or, once
 * listening, the address served.
 */
function agentAuth(
  config: Config,
  log: Logger,
  knex: Knex,
  bus: ClusterBus,
  baseUrl: () => string | null,
): Pick<Services, 'authenticate' | 'oauth'> {
  const authenticate = createAgentAuth(knex, bus);
  if (!config.oauth) return { authenticate };
  const { audience } = config.oauth;
  const resource = () => audience ?? `${(baseUrl() ?? publicBaseUrl(config)).replace(/\/$/, '')}/mcp`;
  return {
    authenticate,
    oauth: createOAuthAgentAuth(knex, bus, createOAuthVerifier(config.oauth, { resource, log })),
  };
}

/** The first run's credentials still to be shown, if any (a test may stop the process right here). */
async function firstRunOf(deps: FirstRunDeps, options: ServiceOptions): Promise<FirstRun | undefined> {
  const first = deps.config.demo ? await seedFirstRun(deps) : undefined;
  await options.faults?.at('after_first_run');
  return first;
}

interface LifecycleDeps {
  config: Config;
  log: Logger;
  audit: AuditLog;
  db: Database;
  signer: { key_id: string };
}

/**
 * Where this process serves the web form, and its server.started and server.stopped rows. The stopped row
 * is appended before anything closes (the audit log drains, then the database closes), after the pending
 * refusal summaries; if either cannot be written, closing goes on regardless.
 */
function createLifecycle(deps: LifecycleDeps) {
  const startedAt = new Date();
  let web: string | null = null;
  let transport: Transport | undefined;
  let closing: Promise<void> | undefined;
  const perMinute = deps.config.audit.denied_rows_per_minute;
  const pace = createPace({ perSecond: deps.config.audit.refusals_per_second_per_address });
  const refusals = createRefusals({ knex: deps.db.knex, audit: deps.audit, log: deps.log, perMinute, pace });
  // Links people follow: http.public_url, else this process's own web form, else none (then the CLI).
  const base = () => deps.config.http.public_url ?? web;
  return {
    startedAt,
    refusals,
    baseUrl: base,
    reviewUrl: (id: string) => {
      const at = base();
      return at ? new URL(`/approvals/${id}`, at).href : null;
    },
    listeningAt(url: string) {
      web = url;
    },
    async recordStart(how: Transport) {
      await deps.audit.append(
        startedRow({
          config: deps.config,
          signingKeyId: deps.signer.key_id,
          transport: how,
          dialect: deps.db.dialect,
          web,
        }),
      );
      transport = how;
    },
    close(reason: StopReason = 'signal', closeAll: () => Promise<void>) {
      closing ??= (async () => {
        await refusals
          .close()
          .catch((err: unknown) => deps.log.error({ err }, 'refusal summaries could not be recorded'));
        if (transport) {
          await deps.audit
            .append(stoppedRow(reason, startedAt, transport))
            .catch((err: unknown) => deps.log.error({ err }, 'server.stopped could not be recorded'));
        }
        await closeAll();
      })();
      return closing;
    },
  };
}

/** A pace of answers (src/audit/pace.ts) whose waiting answers are let go at once on a stop. */
function paceUntilStop(perSecond: number, closers: Closers) {
  const pace = createPace({ perSecond });
  closers.push(async () => pace.release());
  return pace;
}

/**
 * OpenTelemetry traces, only when an OTLP endpoint is configured: otherwise the SDK is not even loaded.
 * Closed (buffered spans exported) after everything else but the database.
 */
async function openTracing(config: Config, closers: Closers): Promise<Tracer | undefined> {
  const url = tracesUrl(config.tracing);
  if (!url) return undefined;
  const { startTracing } = await import('../server/otel.ts');
  const tracing = startTracing({ url, version: VERSION });
  closers.push(() => tracing.shutdown());
  return tracing;
}

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

/**
 * The built-in store (its names' look-alike skeletons filled in where missing), the HTTP bridge when
 * configured, and the set the contract tools pick from.
 */
async function openConnectors(db: Database, blobs: BlobStore, config: Config, log: Logger, tracer?: Tracer) {
  await fillNameSkeletons(db.knex);
  // The fence every local write passes is approval's: the approval must still be executing.
  const local = createLocalConnector(db.knex, blobs, WRITE_FENCE);
  const bridge = config.bridge ? createBridgeConnector(config.bridge, log) : undefined;
  const set = { local, ...(bridge ? { bridge } : {}) };
  // A bridge target's name is compared with the directory's (one statement per resolved bridge target).
  const directory = (name: string) => directoryLookalikes(db.knex, name);
  const connectors = createConnectorSet(set, config.connectors.default, tracer, directory);
  return { local, bridge, connectors };
}

/**
 * The stores the people's pages use in place of the database: sessions, sign-in, the user directory,
 * Slack's, and the audit log as compliance reads it.
 */
function pageStores(knex: Knex, audit: AuditLog, config: Config, roots: HostRoots) {
  return {
    signIn: createSignIn({
      knex,
      audit,
      roots: () => Promise.resolve(roots),
      limits: { perUser: config.web.login_failures_per_user, perIp: config.web.login_failures_per_ip },
    }),
    auditReader: createAuditReader(knex),
    auditExports: createExportRecords(knex),
    sessions: createSessionStore(
      knex,
      { idleMs: config.web.session_idle_s * 1000, absoluteMs: config.web.session_absolute_s * 1000 },
      roots.key('session'),
      { roots, audit },
    ),
    people: createUserDirectory(knex, roots),
    slackStore: createSlackStore(knex),
  };
}

/** A cluster is one server (docs/cluster.md): one signing key, one leader for periodic work, one event bus. */
async function joinCluster(
  opts: { db: Database; audit: AuditLog; config: Config; log: Logger; opened: OpenedRoots },
  closers: Closers,
) {
  const { db, audit, config, log, opened } = opts;
  const checkpoints = await checkpointDeps(db.knex, audit, config, log, opened);
  await assertClusterSigningKey(db.knex, checkpoints.signer.public_key);
  const url = config.database_url;
  const bus = url ? await createPgBus(db.knex, url, log) : createLocalBus(log);
  closers.push(() => bus.close());
  const leadership = url ? await createLeadership(url, log) : soleLeader;
  closers.push(() => leadership.close());
  return { checkpoints, bus, leadership };
}

/**
 * Upstream MCP servers: connected in the background; start-up waits a little for their first
 * listing, never for an upstream that is down (its tools answer SOURCE_UNAVAILABLE meanwhile).
 */
async function connectUpstreams(
  config: Config,
  log: Logger,
  bus: ClusterBus,
  pins: UpstreamPins,
  closers: Closers,
  waits: WaitAccount,
) {
  const upstreams = config.upstreams
    .map((u) =>
      connectUpstream(u, {
        ...{ log, timeoutMs: u.timeout_ms ?? upstreamTimeoutMs(config) },
        ...{ clientVersion: VERSION, pins },
      }),
    )
    // Each call timed from its request to its answer: the upstream's part of a call's wait.
    .map((u) => ({ ...u, call: waits.upstream(u.call) }));
  closers.push(async () => {
    await Promise.all(upstreams.map((u) => u.close()));
  });
  await Promise.race([
    Promise.all(upstreams.map((u) => u.firstAttempt)),
    new Promise((r) => setTimeout(r, UPSTREAM_START_WAIT_MS).unref()),
  ]);
  // Another replica heard an upstream's list change: list ours again, so that every replica answers alike.
  const stopRelisting = bus.onForeign((event) => {
    if (event.kind === 'tools_list_changed') for (const u of upstreams) void u.refresh();
  });
  closers.push(async () => stopRelisting());
  return upstreams;
}

/**
 * The runner of approved tasks (server/task-runner.ts); it stops before the database closes. Returns
 * its poke, for the decisions the operator's commands make in this process.
 */
function startTasks(
  deps: {
    approvals: Approvals;
    pipeline: CallPipeline;
    knex: Knex;
    bus: ClusterBus;
    config: Config;
    log: Logger;
  },
  closers: Closers,
): () => void {
  // On the embedded database every decision is made in this process and pokes the runner; on
  // PostgreSQL, one made elsewhere is announced (the task change trigger) while the bus listens.
  const single = !deps.config.database_url;
  const runner = startTaskRunner({
    approvals: deps.approvals,
    pipeline: deps.pipeline,
    async agentOf(id) {
      const row = await agentById(deps.knex, id);
      // An agent whose record was changed by SQL (authority.ts) runs nothing, as a revoked one.
      return row && row.revoked_at === null && agentSealed(await hostRootsOf(deps.knex), row)
        ? row
        : undefined;
    },
    log: deps.log,
    interval_ms: TASK_POLL_INTERVAL_MS,
    stale_ms: 2 * deps.config.limits.call_timeout_ms,
    announced: () => single || deps.bus.listening(),
    safety_ms: TASK_SAFETY_ROUND_MS,
  });
  // A task's request approved on this replica runs at once; one approved elsewhere when announced.
  const stopListening = deps.approvals.tasks.onApproved(runner.poke);
  const stopAnnounced = deps.bus.onTaskChanged(() => runner.poke());
  closers.push(async () => {
    stopListening();
    stopAnnounced();
    await runner.close();
  });
  return runner.poke;
}

/**
 * While task changes are announced, the longest a replica goes without looking for runnable tasks: a
 * safety net only (a lost connection is announced as a change of every task, and a claim going stale
 * sets its own timer).
 */
const TASK_SAFETY_ROUND_MS = 60_000;

interface PeriodicDeps {
  approvals: Approvals;
  /** For the runner of approved tasks. */
  pipeline: CallPipeline;
  knex: Knex;
  local: ReturnType<typeof createLocalConnector>;
  bridge: ReturnType<typeof createBridgeConnector> | undefined;
  memory: ReturnType<typeof createAgentMemory>;
  limiter: ReturnType<typeof createRateLimiter>;
  checkpoints: CheckpointDeps;
  bus: ClusterBus;
}

/**
 * Expiry, reconciliation of interrupted executions and purges, then signed checkpoints: once per
 * cluster, on the replica that leads (always, on PGlite), and at once whenever a replica takes the lead
 * (the one before may have died mid-execution). Returns the maintenance step, run once before returning,
 * and the task runner's poke.
 */
async function startPeriodicWork(
  deps: PeriodicDeps,
  leadership: Leadership,
  config: Config,
  log: Logger,
  closers: Closers,
): Promise<{ maintain: () => Promise<void>; pokeTasks: () => void }> {
  let maintaining: Promise<void> | undefined;
  const maintain = () => (maintaining ??= maintainOnce(deps, log).finally(() => (maintaining = undefined)));
  leadership.onLead(() => void maintain());
  await maintaining;
  // Approved tasks are run on every replica, not only the leader's: each task is claimed by one.
  const pokeTasks = startTasks({ ...deps, config, log }, closers);
  const timer = setInterval(() => {
    if (leadership.isLeader()) void maintain();
  }, config.approval.maintenance_interval_s * 1000);
  timer.unref();
  const stopCheckpoints = startCheckpoints(deps.checkpoints, leadership, config, log);
  closers.push(async () => {
    clearInterval(timer);
    stopCheckpoints();
    await maintaining;
  });
  return { maintain, pokeTasks };
}

/** How often the leader looks at what this process appended (in memory) for a checkpoint to sign. */
const CHECKPOINT_LOOK_MS = 1000;
/**
 * On PostgreSQL, the longest the leader goes without reading the chain for rows other replicas
 * appended. On the embedded database every row is appended by this process: it reads when it did.
 */
const CHECKPOINT_READ_MS = 10_000;

/**
 * Signed checkpoints of the audit chain by the leader, as often as the cadence asks (and at every
 * export). The chain is read when this process appended since the last read (looked at in memory each
 * second), when the oldest uncovered row comes due, and on PostgreSQL at the latest every
 * CHECKPOINT_READ_MS (rows other replicas appended): idle, one read in ten seconds there, and none on
 * the embedded database. After a failure it waits a whole
 * interval, so a broken chain is reported once an interval, not every read. Returns the stop.
 */
function startCheckpoints(
  deps: CheckpointDeps,
  leadership: Leadership,
  config: Config,
  log: Logger,
): () => void {
  const cadence = { interval_s: config.audit.checkpoint_interval_s, rows: config.audit.checkpoint_rows };
  const look = Math.min(CHECKPOINT_LOOK_MS, cadence.interval_s * 1000);
  const readEvery = config.database_url ? CHECKPOINT_READ_MS : Infinity;
  let checkpointing = false;
  let [readAt, failedAt] = [0, -Infinity];
  let seen: number | undefined;
  leadership.onLead(() => (readAt = 0));
  const checkpointTimer = setInterval(() => {
    const now = Date.now();
    const appended = deps.audit.appended().committed?.seq;
    if (!leadership.isLeader() || checkpointing || now - failedAt < cadence.interval_s * 1000) return;
    if (appended === seen && now < readAt) return;
    checkpointing = true;
    seen = appended;
    checkpointTick(deps, cadence, now)
      .then(({ due_at }) => (readAt = Math.min(due_at ?? Infinity, Date.now() + readEvery)))
      .catch((err: unknown) => {
        [failedAt, readAt] = [Date.now(), 0];
        log.error({ err }, 'audit checkpoint failed');
      })
      .finally(() => (checkpointing = false));
  }, look);
  checkpointTimer.unref();
  return () => clearInterval(checkpointTimer);
}

async function maintainOnce(deps: PeriodicDeps, log: Logger): Promise<void> {
  try {
    const expired = await deps.approvals.expireDue();
    if (expired > 0) log.info({ expired }, 'approval requests expired');
    await deps.approvals.reconcile(
      // Remote sources only: the local store is read inside the reconciling transaction (fenced).
      (source, key) =>
        source === 'bridge' && deps.bridge ? deps.bridge.findWrite(key) : Promise.resolve(undefined),
      log,
    );
    await deps.approvals.purgeIdempotencyKeys();
    await deps.memory.purge();
    await deps.limiter.purge();
  } catch (err) {
    log.error({ err }, 'approval maintenance failed');
  }
}
