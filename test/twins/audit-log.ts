import { randomUUID } from 'node:crypto';
import type { AuditLog } from '../../src/audit/index.ts';
import { auditInput, chainHash, GENESIS_HASH, type AuditRow } from '../../src/audit/chain.ts';
import { systemClock, type Clock } from '../../src/core/clock.ts';
import { auditUnavailable } from '../../src/db/outage.ts';

/** What a test can do to the audit twin besides appending: look at the rows, cut it off, hold commits. */
export interface TwinAuditLog extends AuditLog {
  /** The committed rows, oldest first. */
  readonly rows: readonly AuditRow[];
  /**
   * From now on, every append fails as the real log's does when the database is gone (auditUnavailable);
   * `false` brings it back.
   */
  outage(on?: boolean): void;
  /**
   * Holds commits: appends are chained and announced (onChained) at once, and commit when the returned
   * function is called — the moment a transport holding the answer waits for (server/call-context.ts).
   */
  holdCommits(): () => void;
}

/**
 * The audit log's twin in memory: rows chained as the real log chains them (the same auditInput and
 * chainHash), stamped by `clock`. No transactions: appendIn throws (the approvals twin appends each row
 * on its own), and appendWith knows no head, so it does nothing and resolves undefined, as the real one
 * does before it has appended (its callers then take their transaction path). Held to the real log's
 * answers by test/twins/contracts/audit-log.ts.
 */
export function twinAuditLog(clock: Clock = systemClock): TwinAuditLog {
  const rows: AuditRow[] = [];
  let down = false;
  let held: Promise<void> | undefined;
  const appendListeners = new Set<() => void>();
  /** The next row's seq and link, counting rows announced and not yet committed. */
  let tail = { seq: 0, hash: GENESIS_HASH };
  const chain: AuditLog['append'] = async (input, onChained) => {
    const p = auditInput(input);
    const row: AuditRow = {
      seq: tail.seq + 1,
      event_id: randomUUID(),
      ts: clock.now().toISOString(),
      ...p,
      prev_hash: tail.hash,
      hash: '',
    };
    row.hash = chainHash(row.prev_hash, row);
    tail = { seq: row.seq, hash: row.hash };
    onChained?.(row);
    if (held) await held;
    if (down) {
      // Nothing committed: the next row takes this one's place, as after a failed batch.
      tail = rows.length
        ? { seq: rows.at(-1)!.seq, hash: rows.at(-1)!.hash }
        : { seq: 0, hash: GENESIS_HASH };
      throw auditUnavailable(new Error('connect ECONNREFUSED (audit twin outage)'));
    }
    rows.push(row);
    for (const l of appendListeners) l();
    return row;
  };
  return {
    rows,
    outage(on = true) {
      down = on;
    },
    holdCommits() {
      let release = () => {};
      held = new Promise<void>((resolve) => (release = resolve));
      return () => {
        held = undefined;
        release();
      };
    },
    append: chain,
    appendIn() {
      throw new Error('the audit twin has no transactions: test appendIn against the real log (test/store/)');
    },
    appendWith: async () => undefined,
    drain: async () => {
      await held;
    },
    headSeq: async () => rows.at(-1)?.seq ?? 0,
    appended: () => {
      const last = rows.at(-1);
      return last ? { committed: { seq: last.seq, hash: last.hash } } : {};
    },
    onAppended(listener) {
      appendListeners.add(listener);
      return () => void appendListeners.delete(listener);
    },
  };
}
