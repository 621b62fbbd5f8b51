import { createPace, createRefusals, type AuditLog } from '../../audit/index.ts';
import type { Config } from '../../config.ts';
import type { Database } from '../../db/knex.ts';
import type { Logger } from '../../log.ts';
import { startedRow, stoppedRow, type StopReason, type Transport } from '../lifecycle.ts';
import { defineService, type Lifecycle } from './parts.ts';

export const lifecycle = defineService({
  name: 'lifecycle',
  needs: ['config', 'log', 'audit', 'db', 'checkpoints'],
  provides: ['lifecycle'],
  open: ({ config, log, audit, db, checkpoints }) => ({
    lifecycle: createLifecycle({ config, log, audit, db, signer: checkpoints.signer }),
  }),
});

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
function createLifecycle(deps: LifecycleDeps): Lifecycle {
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
