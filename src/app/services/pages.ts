import type { Connection } from '../../db/knex.ts';
import { createSessionStore, createSignIn, createUserDirectory } from '../../accounts/index.ts';
import { createAuditReader, createExportRecords, type AuditLog } from '../../audit/index.ts';
import type { Config } from '../../config.ts';
import type { HostRoots } from '../../core/host-roots.ts';
import { createSlackStore } from '../../notify/index.ts';
import { defineService } from './parts.ts';

export const pages = defineService({
  name: 'pages',
  needs: ['db', 'audit', 'config', 'opened'],
  provides: ['signIn', 'auditReader', 'auditExports', 'sessions', 'people', 'slackStore'],
  open: ({ db, audit, config, opened }) => pageStores(db.knex, audit, config, opened.roots),
});

/**
 * The stores the people's pages use in place of the database: sessions, sign-in, the user directory,
 * Slack's, and the audit log as compliance reads it.
 */
function pageStores(knex: Connection, audit: AuditLog, config: Config, roots: HostRoots) {
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
