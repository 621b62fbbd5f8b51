import type { Config } from '../config.ts';
import type { Connection } from '../db/knex.ts';
import type { AnchorReport } from './anchors/check.ts';
import { verifyDatabaseAnchors, type AnchorOptions } from './anchors/verify-anchors.ts';
import { checkpointDeps, verifyDatabase, type DatabaseReport } from './context.ts';
import { exportToFile, type ExportFileRequest, type ExportFileResult } from './export-file.ts';
import type { AuditLog } from './log.ts';
import { readHostRoots } from '../core/host-roots.ts';
import { configError } from '../config.ts';
import { acceptRestore, type RestoreAccepted } from './signed-head.ts';

/** What an operator asks of the whole log: a signed export to a file, and the checks of the live table. */
export interface AuditChecks {
  /** An export and its signed manifest written to `req.path` (exportToFile). */
  exportToFile(req: ExportFileRequest): Promise<ExportFileResult>;
  /** The live chain and its checkpoints, with these keys or the one the cluster recorded (verifyDatabase). */
  verify(publicKeyPems?: readonly string[]): Promise<DatabaseReport>;
  /** The live table against stored time-stamp tokens and a witness directory. */
  verifyAnchors(opts: AnchorOptions): Promise<AnchorReport>;
  /** Accepts a database restored from a backup: gives up the newer heads, audited (acceptRestore). */
  acceptRestore(reason: string, actor: string): Promise<RestoreAccepted>;
}

export function createAuditChecks(knex: Connection, audit: AuditLog, config: Config): AuditChecks {
  return {
    exportToFile: async (req) => exportToFile(await checkpointDeps(knex, audit, config), req),
    verify: (keys) => verifyDatabase(knex, keys, config),
    // Anchors are matched by the origin the host pins: a database that renamed its log disarms none.
    verifyAnchors: (opts) =>
      verifyDatabaseAnchors(knex, { ...opts, origin: readHostRoots(config.secrets.host_roots_path)?.origin }),
    acceptRestore(reason, actor) {
      const roots = readHostRoots(config.secrets.host_roots_path);
      if (!roots)
        throw configError(
          `secrets.host_roots_path: ${config.secrets.host_roots_path} does not exist on this host`,
        );
      const witnessDir = config.audit.anchors.witness_dir;
      const deps = { knex, audit, dataDir: config.data_dir, origin: roots.origin };
      return acceptRestore(witnessDir ? { ...deps, witnessDir } : deps, reason, actor);
    },
  };
}
