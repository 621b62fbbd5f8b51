import type { Connection } from '../db/knex.ts';
import type { AdminDeps } from '../admin/commands.ts';
import {
  createAccountAdmin,
  createSignIn,
  sealUnsealedRecords,
  storedTokenHashes,
} from '../accounts/index.ts';
import { createApprovals, sealUnsealedPolicy, type PatternRunner } from '../approval/index.ts';
import { createAuditChecks, createAuditLog, headSeq, type AuditLog } from '../audit/index.ts';
import { publicBaseUrl, type Config } from '../config.ts';
import { createDirectoryImport, createPinAdmin, type BlobStore } from '../connectors/index.ts';
import { migrateLatest } from '../db/migrations.ts';
import { createSettings } from '../db/settings.ts';
import { lazyHostRoots } from '../db/host-roots.ts';
import type { HostRoots } from '../core/host-roots.ts';

/**
 * The stores the operator's commands run on, over one database: the same for the command line's own
 * process and for the server that runs them behind its loopback endpoint (which passes its worker pool
 * for the rules' long matches: `policy explain` on the server's process never holds its event loop).
 */
export function adminDeps(
  db: {
    knex: Connection;
    blobs: BlobStore;
    config: Config;
    audit?: AuditLog;
    roots?: () => Promise<HostRoots>;
    patterns?: PatternRunner;
  },
  hooks: Pick<AdminDeps, 'agentChanged' | 'upstreamsChanged'> & {
    /** Called after a command approved a task's request (the server's task runner runs it at once). */
    taskApproved?: () => void;
  } = {},
): AdminDeps {
  const { knex, config } = db;
  const { taskApproved, ...commandHooks } = hooks;
  const roots =
    db.roots ??
    lazyHostRoots(
      knex,
      config.secrets.host_roots_path,
      undefined,
      () => storedTokenHashes(knex),
      (q) => headSeq(q ?? knex),
      sealUnsealedRecords,
      sealUnsealedPolicy,
    );
  const audit = db.audit ?? createAuditLog(knex, { roots });
  return {
    config,
    // The host roots are made (or read) here too, as by a first start: a cluster's init step that only
    // migrates leaves the file for replicas that mount it read-only.
    migrate: async () => {
      const applied = await migrateLatest(knex);
      await roots();
      return applied;
    },
    accounts: createAccountAdmin(knex, audit, roots),
    signIn: createSignIn({
      knex,
      audit,
      roots,
      limits: { perUser: config.web.login_failures_per_user, perIp: config.web.login_failures_per_ip },
    }),
    approvals: createApprovals({
      knex,
      audit,
      config,
      reviewUrl: (id) => new URL(`/approvals/${id}`, publicBaseUrl(config)).href,
      roots,
      patterns: db.patterns,
      onTaskApproved: taskApproved,
    }),
    directory: createDirectoryImport(knex, db.blobs),
    auditChecks: createAuditChecks(knex, audit, config),
    pins: createPinAdmin(knex, audit),
    settings: createSettings(knex),
    ...commandHooks,
  };
}
