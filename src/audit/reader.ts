import type { AuditRow } from './chain.ts';
import { latestCheckpoint, type Checkpoint } from './checkpoints.ts';
import { verifyDatabase, type DatabaseReport } from './context.ts';
import type { Connection } from '../db/knex.ts';
import { auditRow, headSeq, queryAudit, type AuditQuery, type ListedRow } from './query.ts';

/**
 * The log as its readers see it (the compliance pages): pages of rows, one row, the head, the last
 * checkpoint and the chain's check. Nothing here writes.
 */
export interface AuditReader {
  /** Rows matching `filter`, newest first, `page.limit` at a time, before `page.beforeSeq`. */
  query(filter: AuditQuery, page: { beforeSeq?: number; limit: number }): Promise<ListedRow[]>;
  /** The row `seq`, if there is one. */
  row(seq: number): Promise<AuditRow | undefined>;
  /** The seq of the newest committed row (0 for an empty log). */
  headSeq(): Promise<number>;
  /** The newest signed checkpoint, if any was made. */
  latestCheckpoint(): Promise<Checkpoint | undefined>;
  /** The live table verified with the key and origin the cluster recorded (verifyDatabase). */
  verify(): Promise<DatabaseReport>;
}

export function createAuditReader(knex: Connection): AuditReader {
  return {
    query: (filter, page) => queryAudit(knex, filter, page),
    row: (seq) => auditRow(knex, seq),
    headSeq: () => headSeq(knex),
    latestCheckpoint: () => latestCheckpoint(knex),
    verify: () => verifyDatabase(knex),
  };
}
