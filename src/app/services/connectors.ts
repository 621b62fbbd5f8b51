import { WRITE_FENCE } from '../../approval/index.ts';
import type { Config } from '../../config.ts';
import {
  createBridgeConnector,
  createConnectorSet,
  createLocalConnector,
  directoryLookalikes,
  fillNameSkeletons,
  type BlobStore,
} from '../../connectors/index.ts';
import type { Tracer } from '../../core/tracing.ts';
import type { Database } from '../../db/knex.ts';
import type { Logger } from '../../log.ts';
import { defineService } from './parts.ts';

export const connectors = defineService({
  name: 'connectors',
  needs: ['db', 'blobs', 'config', 'log', 'tracer'],
  provides: ['local', 'bridge', 'connectors'],
  open: ({ db, blobs, config, log, tracer }) => openConnectors(db, blobs, config, log, tracer),
});

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
