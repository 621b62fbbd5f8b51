import { checkpointDeps, type AuditLog } from '../../audit/index.ts';
import { createLocalBus, createPgBus } from '../../cluster/bus.ts';
import { createLeadership, soleLeader } from '../../cluster/leadership.ts';
import { assertClusterSigningKey } from '../../cluster/signing-key.ts';
import type { Config } from '../../config.ts';
import type { Database } from '../../db/knex.ts';
import type { OpenedRoots } from '../../db/host-roots.ts';
import type { Logger } from '../../log.ts';
import { defineService, type Closers } from './parts.ts';

export const cluster = defineService({
  name: 'cluster',
  needs: ['db', 'audit', 'config', 'log', 'opened'],
  provides: ['checkpoints', 'bus', 'leadership'],
  open: (have, closers) => joinCluster(have, closers),
});

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
