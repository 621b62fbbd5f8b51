import type { Connection } from '../../db/knex.ts';
import {
  agentById,
  agentSealed,
  type createAgentMemory,
  type createRateLimiter,
} from '../../accounts/index.ts';
import { TASK_POLL_INTERVAL_MS, type Approvals } from '../../approval/index.ts';
import { checkpointTick, type CheckpointDeps } from '../../audit/index.ts';
import type { ClusterBus } from '../../cluster/bus.ts';
import type { Leadership } from '../../cluster/leadership.ts';
import type { Config } from '../../config.ts';
import type { createBridgeConnector, createLocalConnector } from '../../connectors/index.ts';
import { hostRootsOf } from '../../db/host-roots.ts';
import type { Logger } from '../../log.ts';
import { startTaskRunner, type CallPipeline } from '../../server/index.ts';
import { defineService, type Closers } from './parts.ts';

/** Maintenance, the runner of approved tasks and signed checkpoints (startPeriodicWork). */
export const periodic = defineService({
  name: 'periodic work',
  needs: [
    'approvals',
    'local',
    'bridge',
    'memory',
    'limiter',
    'pipeline',
    'db',
    'checkpoints',
    'bus',
    'leadership',
    'config',
    'log',
  ],
  provides: ['maintain', 'pokeTasks'],
  open: ({ db, config, log, ...have }, closers) =>
    startPeriodicWork({ ...have, knex: db.knex }, have.leadership, config, log, closers),
});

/**
 * The runner of approved tasks (server/task-runner.ts); it stops before the database closes. Returns
 * its poke, for the decisions the operator's commands make in this process.
 */
function startTasks(
  deps: {
    approvals: Approvals;
    pipeline: CallPipeline;
    knex: Connection;
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
  knex: Connection;
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

/** After this process appends, how soon the leader reads the chain for a checkpoint to sign (at most once a look). */
const CHECKPOINT_LOOK_MS = 1000;
/**
 * On PostgreSQL, the longest the leader goes without reading the chain for rows other replicas
 * appended. On the embedded database every row is appended by this process: it reads when it did.
 */
const CHECKPOINT_READ_MS = 10_000;

/**
 * Signed checkpoints of the audit chain by the leader, as often as the cadence asks (and at every
 * export). The chain is read a look after this process appends (told by the audit log, at most once a
 * look while appends follow each other), when the oldest uncovered row comes due, and on PostgreSQL at
 * the latest every CHECKPOINT_READ_MS (rows other replicas appended): idle, one read in ten seconds
 * there, and none on the embedded database. Each read sets a timer for the next one; nothing wakes in
 * between. After a failure it waits a whole interval, so a broken chain is reported once an interval,
 * not every read. Returns the stop.
 */
function startCheckpoints(
  deps: CheckpointDeps,
  leadership: Leadership,
  config: Config,
  log: Logger,
): () => void {
  const cadence = { interval_s: config.audit.checkpoint_interval_s, rows: config.audit.checkpoint_rows };
  const [intervalMs, look] = [
    cadence.interval_s * 1000,
    Math.min(CHECKPOINT_LOOK_MS, cadence.interval_s * 1000),
  ];
  const readEvery = config.database_url ? CHECKPOINT_READ_MS : Infinity;
  let [checkpointing, stopped] = [false, false];
  let [readAt, failedAt] = [0, -Infinity];
  let seen: number | undefined;
  const wake = wakeUp(() => check());
  const appended = () => deps.audit.appended().committed?.seq;
  /** When to look next: after a failure a whole interval, after this process appended a look, else at readAt. */
  const next = () =>
    Date.now() - failedAt < intervalMs
      ? failedAt + intervalMs
      : appended() !== seen
        ? Date.now() + look
        : readAt;
  const check = () => {
    if (stopped || !leadership.isLeader() || checkpointing) return;
    const now = Date.now();
    if (now - failedAt < intervalMs || (appended() === seen && now < readAt)) return wake.at(next());
    checkpointing = true;
    seen = appended();
    checkpointTick(deps, cadence, now)
      .then(({ due_at }) => (readAt = Math.min(due_at ?? Infinity, Date.now() + readEvery)))
      .catch((err: unknown) => {
        [failedAt, readAt] = [Date.now(), 0];
        log.error({ err }, 'audit checkpoint failed');
      })
      .finally(() => {
        checkpointing = false;
        // Never sooner than a look: a due time already past (a checkpoint not yet signable) is read again then.
        wake.at(Math.max(next(), Date.now() + look));
      });
  };
  leadership.onLead(() => {
    readAt = 0;
    wake.at(Date.now() + look);
  });
  const stopListening = deps.audit.onAppended(() => {
    if (leadership.isLeader()) wake.at(Date.now() + look);
  });
  return () => {
    stopped = true;
    stopListening();
    wake.stop();
  };
}

/** One timer for `run`, set for the soonest time asked of it (a later time asked meanwhile changes nothing). */
function wakeUp(run: () => void) {
  let timer: NodeJS.Timeout | undefined;
  let timerAt = Infinity;
  return {
    at(when: number) {
      if (!Number.isFinite(when) || when >= timerAt) return;
      clearTimeout(timer);
      timerAt = when;
      timer = setTimeout(
        () => {
          [timer, timerAt] = [undefined, Infinity];
          run();
        },
        Math.max(0, when - Date.now()),
      );
      timer.unref();
    },
    stop() {
      clearTimeout(timer);
      timerAt = -Infinity;
    },
  };
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
