import type { Knex } from 'knex';
import { createAuditLog } from '../audit/index.ts';
import { announceToolsChanged } from '../cluster/bus.ts';
import type { Config, UpstreamToolMode } from '../config.ts';
import { PINS, pinRowFacts, readPins, type PinRow } from '../connectors/index.ts';
import { AppError } from '../core/errors.ts';
import { dialectOf } from '../db/knex.ts';

/** One pinned tool as `countersign upstream list` shows it. */
export interface PinView {
  upstream: string;
  tool: string;
  class: PinRow['class'];
  /** The config's mapping of the tool, which wins over the pin; null when it has none. */
  config: UpstreamToolMode | null;
  input_schema_sha256: string;
  pinned_at: string;
  accepted_by: string | null;
  /** A listing's less gated class, held until accepted. */
  pending: { class: PinRow['class']; input_schema_sha256: string; since: string | null } | null;
}

const viewOf = (row: PinRow, config: Config): PinView => ({
  upstream: row.upstream,
  tool: row.tool,
  class: row.class,
  config: config.upstreams.find((u) => u.name === row.upstream)?.tools[row.tool] ?? null,
  input_schema_sha256: row.input_schema_sha256,
  pinned_at: row.pinned_at,
  accepted_by: row.accepted_by,
  pending:
    row.pending_class && row.pending_input_schema_sha256
      ? {
          class: row.pending_class,
          input_schema_sha256: row.pending_input_schema_sha256,
          since: row.pending_since,
        }
      : null,
});

/** The pins of every upstream, or of one (NOT_FOUND when it has none). */
export async function listPins(knex: Knex, config: Config, upstream?: string): Promise<PinView[]> {
  const rows = await readPins(knex, upstream);
  if (upstream !== undefined && rows.length === 0) throw unknownUpstream(upstream);
  return rows.map((r) => viewOf(r, config));
}

const unknownUpstream = (name: string) =>
  new AppError('NOT_FOUND', `no tools of an upstream named "${name}" have been seen`, 'unknown_upstream');

export interface Accepted {
  tool: string;
  from: PinRow['class'];
  to: PinRow['class'];
}

/**
 * Re-pins an upstream's tools (or one of them) to the class their latest listing holds back, each with
 * an `upstream.classification_accepted` row, in one transaction. Running replicas on PostgreSQL are told
 * when it commits; `refresh`, when given, applies it in this process (the server behind the embedded one).
 */
export async function acceptPins(
  deps: { knex: Knex; refresh?: () => Promise<void> },
  cmd: { upstream: string; tool?: string; actor: string },
): Promise<{ accepted: Accepted[] }> {
  const audit = createAuditLog(deps.knex);
  const accepted = await deps.knex.transaction(async (trx) => {
    const rows = await lockPins(trx, cmd.upstream, cmd.tool);
    const done: Accepted[] = [];
    for (const row of rows.filter((r) => r.pending_class !== null)) {
      await trx(PINS)
        .where({ upstream: row.upstream, tool: row.tool })
        .update({
          class: row.pending_class,
          annotations: JSON.stringify(row.pending_annotations ?? {}),
          input_schema_sha256: row.pending_input_schema_sha256,
          pinned_at: trx.fn.now(),
          accepted_by: cmd.actor,
          revision: row.revision + 1,
          pending_class: null,
          pending_annotations: null,
          pending_input_schema_sha256: null,
          pending_since: null,
        });
      done.push({ tool: row.tool, from: row.class, to: row.pending_class! });
      await audit.appendIn(trx, {
        kind: 'upstream.classification_accepted',
        actor: cmd.actor,
        ...pinRowFacts(row.upstream, row.tool),
        details: {
          upstream: row.upstream,
          upstream_tool: row.tool,
          from: {
            class: row.class,
            annotations: row.annotations,
            input_schema_sha256: row.input_schema_sha256,
          },
          to: {
            class: row.pending_class,
            annotations: row.pending_annotations,
            input_schema_sha256: row.pending_input_schema_sha256,
          },
        },
      });
    }
    if (done.length > 0 && dialectOf(trx) === 'postgres') await announceToolsChanged(trx, 'command');
    return done;
  });
  if (accepted.length > 0) await deps.refresh?.();
  return { accepted };
}

/** The pins an accept may change, locked; an unknown upstream or tool is NOT_FOUND. */
async function lockPins(trx: Knex.Transaction, upstream: string, tool?: string): Promise<PinRow[]> {
  const rows = await readPins(trx, upstream, tool, { lock: true });
  if (rows.length > 0) return rows;
  if (tool === undefined) throw unknownUpstream(upstream);
  const known = await trx(PINS).where({ upstream }).first();
  if (!known) throw unknownUpstream(upstream);
  throw new AppError(
    'NOT_FOUND',
    `upstream "${upstream}" has listed no tool named "${tool}"`,
    'unknown_tool',
  );
}
