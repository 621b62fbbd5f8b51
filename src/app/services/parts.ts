import type { AdminDeps } from '../../admin/commands.ts';
import type { FirstRun } from '../../admin/first-run.ts';
import type { Approvals, createPatternPool } from '../../approval/index.ts';
import type {
  Authenticate,
  createAgentMemory,
  OAuthAgents,
  RateLimiter,
  SessionStore,
  SignIn,
  UserDirectory,
} from '../../accounts/index.ts';
import type {
  AuditLog,
  AuditReader,
  CheckpointDeps,
  ExportRecords,
  Pace,
  Refusals,
} from '../../audit/index.ts';
import type { ClusterBus } from '../../cluster/bus.ts';
import type { Leadership } from '../../cluster/leadership.ts';
import type { Config } from '../../config.ts';
import type {
  BlobStore,
  ConnectorSet,
  createBridgeConnector,
  createLocalConnector,
  Upstream,
  UpstreamPins,
} from '../../connectors/index.ts';
import type { Faults } from '../../core/faults.ts';
import type { HostRoots } from '../../core/host-roots.ts';
import type { Profile } from '../../core/profiles.ts';
import type { Tracer } from '../../core/tracing.ts';
import type { Connection, Database } from '../../db/knex.ts';
import type { OpenedRoots } from '../../db/host-roots.ts';
import type { Logger } from '../../log.ts';
import type { Notifications, SlackStore } from '../../notify/index.ts';
import type { CallPipeline, Metrics } from '../../server/index.ts';
import type { CursorCodec } from '../../tools/index.ts';
import type { StopReason, Transport } from '../lifecycle.ts';

/**
 * Every part the services are built of, by name: what a factory (`ServiceFactory`) may need and what it
 * provides. One interface, so that each factory's input and output are checked against the same types.
 */
export interface Parts {
  // Given by the caller of openServices (GIVEN in services.ts).
  config: Config;
  log: Logger;
  /** The command this process runs (the database's lock names it). */
  command: string;
  /** Set by tests only (test/helpers/faults.ts); production wiring passes none. */
  faults: Faults | undefined;
  /** Set by tests only: given the database once open and migrated (ServiceOptions.onDatabase). */
  onDatabase: ((knex: Connection) => void) | undefined;

  profiles: Map<string, Profile>;
  db: Database;
  opened: OpenedRoots;
  roots: () => Promise<HostRoots>;
  tracer: Tracer | undefined;
  blobs: BlobStore;
  audit: AuditLog;
  checkpoints: CheckpointDeps;
  bus: ClusterBus;
  leadership: Leadership;
  notifications: Notifications | undefined;
  lifecycle: Lifecycle;
  limiter: RateLimiter;
  rateLimitedPace: Pace;
  local: ReturnType<typeof createLocalConnector>;
  bridge: ReturnType<typeof createBridgeConnector> | undefined;
  connectors: ConnectorSet;
  cursors: CursorCodec;
  patterns: ReturnType<typeof createPatternPool>;
  approvals: Approvals;
  memory: ReturnType<typeof createAgentMemory>;
  metrics: Metrics;
  pins: UpstreamPins;
  upstreams: readonly Upstream[];
  pipeline: CallPipeline;
  maintain: () => Promise<void>;
  pokeTasks: () => void;
  admin: AdminDeps;
  firstRun: FirstRun | undefined;
  authenticate: Authenticate;
  /** Absent unless `oauth` is configured. */
  oauth?: OAuthAgents;
  sessions: SessionStore;
  people: UserDirectory;
  slackStore: SlackStore;
  auditReader: AuditReader;
  auditExports: ExportRecords;
  signIn: SignIn;
}

/** Where this process serves the web form, and its server.started and server.stopped rows (lifecycle.ts). */
export interface Lifecycle {
  startedAt: Date;
  refusals: Refusals;
  baseUrl: () => string | null;
  reviewUrl: (id: string) => string | null;
  listeningAt(url: string): void;
  recordStart(how: Transport): Promise<void>;
  close(reason: StopReason | undefined, closeAll: () => Promise<void>): Promise<void>;
}

/** Clean-up steps, run in reverse order of registration; a failing one is logged and the rest still run. */
export type Closers = (() => Promise<void>)[];

/**
 * One feature's part of the services: the parts it needs (opened by factories before it in the list, or
 * given), the parts it provides, and how it opens them. What it must undo on a stop it registers in
 * `closers`, in the order it opens them.
 */
export interface ServiceFactory<
  Need extends keyof Parts = keyof Parts,
  Provide extends keyof Parts = keyof Parts,
> {
  name: string;
  needs: readonly Need[];
  provides: readonly Provide[];
  open(have: Pick<Parts, Need>, closers: Closers): Pick<Parts, Provide> | Promise<Pick<Parts, Provide>>;
}

/** A factory of any parts, as the list holds it (each was checked against `Parts` where it was defined). */
export interface AnyServiceFactory {
  name: string;
  needs: readonly (keyof Parts)[];
  provides: readonly (keyof Parts)[];
  open(have: Partial<Parts>, closers: Closers): Partial<Parts> | Promise<Partial<Parts>>;
}

/** A factory, its needs and provides inferred from the lists it declares (so `open` is checked against them). */
export const defineService = <Need extends keyof Parts, Provide extends keyof Parts>(
  factory: ServiceFactory<Need, Provide>,
): AnyServiceFactory => factory;

/**
 * Refuses a list in which a factory comes before a part it needs, or provides a part already provided,
 * or at the end of which a part of `last` is still missing: a programming error, thrown before anything opens.
 */
export function checkOrder(
  factories: readonly AnyServiceFactory[],
  given: readonly (keyof Parts)[],
  last: readonly (keyof Parts)[] = [],
): void {
  const provided = new Set<keyof Parts>(given);
  const missing = (needs: readonly (keyof Parts)[]) => needs.filter((n) => !provided.has(n));
  for (const f of factories) {
    const absent = missing(f.needs);
    if (absent.length > 0) {
      throw new Error(`service "${f.name}" needs ${absent.join(', ')}, which no service before it provides`);
    }
    const twice = f.provides.filter((p) => provided.has(p));
    if (twice.length > 0)
      throw new Error(`service "${f.name}" provides ${twice.join(', ')}, already provided`);
    for (const p of f.provides) provided.add(p);
  }
  const absent = missing(last);
  if (absent.length > 0) throw new Error(`no service provides ${absent.join(', ')}`);
}
