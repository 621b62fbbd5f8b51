import type { AuditLog } from '../../audit/index.ts';
import { announceToolsChanged } from '../../cluster/bus.ts';
import { AppError } from '../../core/errors.ts';
import { dialectOf, type Connection, type Transaction } from '../../db/knex.ts';
import { pinRowFacts, type PinRow } from './pins.ts';
import { acceptHeld, readPins, upstreamKnown } from './pin-store.ts';

/** One tool re-pinned to the class its listing held back. */
export interface Accepted {
  tool: string;
  from: PinRow['class'];
  to: PinRow['class'];
}

/** The pins as an operator reads and accepts them. */
export interface PinAdmin {
  /** Pins in name order: all, or one upstream's. */
  list(upstream?: string): Promise<PinRow[]>;
  /**
   * Re-pins an upstream's tools (or one of them) to the class their latest listing holds back, each with
   * an `upstream.classification_accepted` row, in one transaction; running replicas on PostgreSQL are
   * told when it commits. An upstream or tool never listed is NOT_FOUND.
   */
  accept(cmd: { upstream: string; tool?: string; actor: string }): Promise<Accepted[]>;
}

export const unknownUpstream = (name: string) =>
  new AppError('NOT_FOUND', `no tools of an upstream named "${name}" have been seen`, 'unknown_upstream');

export function createPinAdmin(knex: Connection, audit: AuditLog): PinAdmin {
  return {
    list: (upstream) => readPins(knex, upstream),
    accept: (cmd) => knex.transaction((trx) => acceptIn(trx, audit, cmd)),
  };
}

async function acceptIn(
  trx: Transaction,
  audit: AuditLog,
  cmd: { upstream: string; tool?: string; actor: string },
): Promise<Accepted[]> {
  const rows = await lockPins(trx, cmd.upstream, cmd.tool);
  const done: Accepted[] = [];
  for (const row of rows.filter((r) => r.pending_class !== null)) {
    await acceptHeld(trx, row, cmd.actor);
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
}

/** The pins an accept may change, locked; an unknown upstream or tool is NOT_FOUND. */
async function lockPins(trx: Transaction, upstream: string, tool?: string): Promise<PinRow[]> {
  const rows = await readPins(trx, upstream, tool, { lock: true });
  if (rows.length > 0) return rows;
  if (tool === undefined) throw unknownUpstream(upstream);
  if (!(await upstreamKnown(trx, upstream))) throw unknownUpstream(upstream);
  throw new AppError(
    'NOT_FOUND',
    `upstream "${upstream}" has listed no tool named "${tool}"`,
    'unknown_tool',
  );
}
