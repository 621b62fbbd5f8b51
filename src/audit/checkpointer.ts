import { createCheckpoint, type Checkpoint, type CheckpointDeps } from './checkpoints.ts';
import { exportToFile, type ExportFileRequest, type ExportFileResult } from './export-file.ts';

/**
 * Checkpoints and file exports as the services hand them to the transports: the signer, the origin,
 * the guard and the anchor in the open, and the database only inside the two operations, so that
 * nothing a transport holds can run SQL of its own.
 */
export interface Checkpointer extends Omit<CheckpointDeps, 'knex'> {
  /** Signs the current head (createCheckpoint). */
  checkpoint(): Promise<Checkpoint | undefined>;
  /** Writes an export and its signed manifest (exportToFile). */
  exportToFile(req: ExportFileRequest): Promise<ExportFileResult>;
}

export function createCheckpointer(deps: CheckpointDeps): Checkpointer {
  const { audit, signer, origin, guard, anchor } = deps;
  return {
    ...{ audit, signer, origin, guard, anchor },
    checkpoint: () => createCheckpoint(deps),
    exportToFile: (req) => exportToFile(deps, req),
  };
}
