import type { Queryable } from '../../db/knex.ts';

/* The checkpoints' time-stamp tokens (audit_anchors): stored as each is received, read by seq range. */

/** Stores a checkpoint's token, with the checkpoint as signed. */
export async function insert(knex: Queryable, row: Record<string, unknown>): Promise<void> {
  await knex('audit_anchors').insert(row);
}

/** The next `limit` anchors after id `afterId` whose checkpoint seq is in [fromSeq, toSeq], by id. */
export async function page(
  knex: Queryable,
  afterId: number,
  fromSeq: number,
  toSeq: number,
  limit: number,
): Promise<{ id: number }[]> {
  return knex('audit_anchors')
    .where('id', '>', afterId)
    .andWhere('seq', '>=', fromSeq)
    .andWhere('seq', '<=', toSeq)
    .orderBy('id')
    .limit(limit);
}
