import { startAdminEndpoint } from '../../admin/endpoint.ts';
import type { AdminDeps } from '../../admin/commands.ts';
import { firstRun as seedFirstRun, type FirstRun, type FirstRunDeps } from '../../admin/first-run.ts';
import type { ClusterBus } from '../../cluster/bus.ts';
import type { Upstream } from '../../connectors/index.ts';
import type { Faults } from '../../core/faults.ts';
import type { Logger } from '../../log.ts';
import { adminDeps } from '../admin-deps.ts';
import { defineService } from './parts.ts';

export const operator = defineService({
  name: 'operator',
  needs: ['db', 'blobs', 'config', 'audit', 'roots', 'patterns', 'bus', 'upstreams', 'pokeTasks'],
  provides: ['admin'],
  open: ({ db, blobs, config, audit, roots, patterns, ...cluster }) => ({
    admin: operatorStores({ knex: db.knex, blobs, config, audit, roots, patterns }, cluster),
  }),
});

/** The first run's accounts exist before a command can reach the embedded database through this process. */
export const firstRun = defineService({
  name: 'first run',
  needs: ['admin', 'faults'],
  provides: ['firstRun'],
  open: async ({ admin, faults }) => ({ firstRun: await firstRunOf(admin, { faults }) }),
});

/**
 * The loopback endpoint through which CLI commands reach the embedded database this process holds (on
 * PostgreSQL they open the database themselves). An accepted upstream pin applies here once the command
 * has committed: the upstreams are listed again.
 */
export const adminEndpoint = defineService({
  name: 'admin endpoint',
  needs: ['db', 'admin', 'log'],
  provides: [],
  async open({ db, admin, log }, closers) {
    if (db.dialect === 'pglite') closers.push(await startAdmin(admin, log));
    return {};
  },
});

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

/** The first run's credentials still to be shown, if any (a test may stop the process right here). */
async function firstRunOf(deps: FirstRunDeps, options: { faults?: Faults }): Promise<FirstRun | undefined> {
  const first = deps.config.demo ? await seedFirstRun(deps) : undefined;
  await options.faults?.at('after_first_run');
  return first;
}
