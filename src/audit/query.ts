import { z } from 'zod';
import { AuditRowFromDb, rowFromDb, type AuditRow } from './chain.ts';
import { AuditKind, AuditResult } from '../core/audit-kinds.ts';
import type { Queryable } from '../db/knex.ts';
import { events } from './store/index.ts';

export const AuditQuery = z.object({
  since: z.iso.datetime({ offset: true }).optional(),
  until: z.iso.datetime({ offset: true }).optional(),
  agent: z.string().min(1).max(64).optional(),
  tool: z.string().min(1).max(128).optional(),
  kind: AuditKind.optional(),
  result: AuditResult.optional(),
  target: z.string().min(1).max(256).optional(),
  approval: z.string().min(1).max(64).optional(),
});
export type AuditQuery = z.infer<typeof AuditQuery>;

/**
 * A row of the audit list: the stored row and its agent's name — the one the row recorded
 * (`details.agent_name`), else, for rows written before rows recorded it, the agent's current name.
 */
const ListedRowFromDb = z.compile(AuditRowFromDb.extend({ agent_name: z.string().nullable() }).array());
export type ListedRow = z.infer<typeof ListedRowFromDb>[number];

/** Rows matching `q`, newest first, `limit` at a time, before `beforeSeq` (paging by seq). */
export async function queryAudit(
  knex: Queryable,
  q: AuditQuery,
  page: { beforeSeq?: number; limit: number },
): Promise<ListedRow[]> {
  return ListedRowFromDb.parse(await events.listRows(knex, q, page));
}

export async function auditRow(knex: Queryable, seq: number): Promise<AuditRow | undefined> {
  const raw = await events.rowAt(knex, seq);
  return raw === undefined ? undefined : rowFromDb(raw);
}

/** The seq of the newest committed row (0 for an empty log). */
export const headSeq = (knex: Queryable): Promise<number> => events.headSeq(knex);
