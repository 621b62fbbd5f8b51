import type { Knex } from 'knex';
import { z } from 'zod';
import { AuditRowFromDb, rowFromDb, type AuditRow } from './chain.ts';
import { AuditKind, AuditResult } from '../core/audit-kinds.ts';

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
  knex: Knex,
  q: AuditQuery,
  page: { beforeSeq?: number; limit: number },
): Promise<ListedRow[]> {
  const query = knex('audit_events as e')
    .joinRaw('left join agents as a on a.id::text = e.agent_id')
    .select('e.*', knex.raw("coalesce(e.details->>'agent_name', a.name) as agent_name"))
    .orderBy('e.seq', 'desc')
    .limit(page.limit);
  if (page.beforeSeq) query.where('e.seq', '<', page.beforeSeq);
  if (q.since) query.where('e.ts', '>=', q.since);
  if (q.until) query.where('e.ts', '<', q.until);
  if (q.agent) query.where((w) => w.where('a.name', q.agent!).orWhere('e.agent_id', q.agent!));
  if (q.tool) query.where('e.tool', q.tool);
  if (q.kind) query.where('e.kind', q.kind);
  if (q.result) query.where('e.result', q.result);
  if (q.target) query.where('e.target_ref', q.target);
  if (q.approval)
    query.where((w) => w.where('e.approval_id', q.approval!).orWhere('e.approval_request_id', q.approval!));
  return ListedRowFromDb.parse(await query);
}

export async function auditRow(knex: Knex, seq: number): Promise<AuditRow | undefined> {
  const raw: unknown = await knex('audit_events').where('seq', seq).first();
  return raw === undefined ? undefined : rowFromDb(raw);
}

export async function headSeq(knex: Knex | Knex.Transaction): Promise<number> {
  const row = (await knex('audit_events').max({ m: 'seq' }).first()) as { m: unknown } | undefined;
  return Number(row?.m ?? 0);
}
