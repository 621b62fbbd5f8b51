import type { Queryable, Transaction } from '../../db/knex.ts';

/*
 * The table of tasks: the writes asked for as MCP tasks, each following one request (../tasks.ts says
 * what a task's state is). A task is read with its whole request (`r_row`), in one statement.
 */

/** The agent's tasks with their requests; `where` narrows by task id or by request. */
const withRequest = (q: Queryable, agent_id: string) =>
  q('approval_tasks as t')
    .join('approval_requests as r', 'r.id', 't.approval_request_id')
    .select('t.*', q.raw('row_to_json(r) as r_row'))
    .where('t.agent_id', agent_id);

/** The agent's task by id or by the request it follows, with its request. */
export async function taskOf(q: Queryable, agent_id: string, where: { id?: string; request?: string }) {
  const query = withRequest(q, agent_id).first();
  if (where.id) query.where('t.id', where.id);
  if (where.request) query.where('t.approval_request_id', where.request);
  return (await query) as Record<string, unknown> | undefined;
}

/** The agent's tasks among `ids`, with their requests. */
export async function tasksOf(q: Queryable, agent_id: string, ids: readonly string[]) {
  return (await withRequest(q, agent_id).whereIn('t.id', ids)) as Record<string, unknown>[];
}

/** A page of the agent's tasks, newest first, after `after`: `limit` + 1 rows, with their requests. */
export async function taskPage(
  q: Queryable,
  agent_id: string,
  opts: { limit: number; after?: { t: string; id: string } },
) {
  const query = withRequest(q, agent_id)
    .orderBy([
      { column: 't.created_at', order: 'desc' },
      { column: 't.id', order: 'desc' },
    ])
    .limit(opts.limit + 1);
  if (opts.after)
    query.whereRaw('(t.created_at, t.id) < (?::timestamptz, ?::uuid)', [opts.after.t, opts.after.id]);
  return (await query) as Record<string, unknown>[];
}

/** A new task, unless one already follows its request. */
export async function insertTask(
  q: Queryable,
  row: {
    id: string;
    approval_request_id: string;
    agent_id: string;
    tool: string;
    arguments: string;
    status: 'working';
    created_at: string;
    updated_at: string;
  },
): Promise<void> {
  await q('approval_tasks').insert(row).onConflict('approval_request_id').ignore();
}

/**
 * Claims up to `limit` working tasks whose request is in one of `runnable`, unclaimed or claimed
 * before `stale`, each by one replica (`skip locked`), in one statement: an idle round costs one round
 * trip. Each comes with its request's approval_id.
 */
export async function claimTasks(
  q: Queryable,
  opts: { now: string; stale: string; limit: number },
): Promise<Record<string, unknown>[]> {
  const claimed = await q.raw(
    `update approval_tasks t set claimed_at = ?
       from approval_requests r
      where r.id = t.approval_request_id
        and t.id in (
          select c.id from approval_tasks c
            join approval_requests q on q.id = c.approval_request_id
           where c.status = 'working'
             and q.status in ('approved', 'succeeded', 'failed')
             and (c.claimed_at is null or c.claimed_at < ?)
           order by c.created_at
           limit ?
           for update of c skip locked)
      returning t.id, t.agent_id, t.tool, t.arguments, t.approval_request_id, r.approval_id`,
    [opts.now, opts.stale, opts.limit],
  );
  return (claimed as { rows: Record<string, unknown>[] }).rows;
}

/** Of the working tasks whose request is in `runnable`: how many, how many unclaimed, the oldest claim. */
export async function runnableTasks(q: Queryable, runnable: readonly string[]) {
  return (await q('approval_tasks as c')
    .join('approval_requests as q', 'q.id', 'c.approval_request_id')
    .where('c.status', 'working')
    .whereIn('q.status', [...runnable])
    .first(
      q.raw('min(c.claimed_at) as oldest'),
      q.raw('count(*) - count(c.claimed_at) as unclaimed'),
      q.raw('count(*) as runnable'),
    )) as { oldest: Date | string | null; unclaimed: number | string; runnable: number | string } | undefined;
}

/** Drops the claim on task `id` while it is working. */
export async function releaseClaim(q: Queryable, id: string): Promise<void> {
  await q('approval_tasks').where({ id, status: 'working' }).update({ claimed_at: null });
}

/** Gives working task `id` its outcome (as JSON text); false when it had one already. */
export async function settleTaskRow(
  q: Queryable,
  id: string,
  outcome: { status: 'completed' | 'failed'; outcome: string; updated_at: string },
): Promise<boolean> {
  return (await q('approval_tasks').where({ id, status: 'working' }).update(outcome)) === 1;
}

/** The agent's task `id`, locked. */
export async function lockTask(trx: Transaction, agent_id: string, id: string) {
  return (await trx('approval_tasks').where({ id, agent_id }).forUpdate().first()) as
    Record<string, unknown> | undefined;
}

/** Marks task `id` cancelled. */
export async function cancelTaskRow(trx: Transaction, id: string, now: string): Promise<void> {
  await trx('approval_tasks').where({ id }).update({ status: 'cancelled', updated_at: now });
}
