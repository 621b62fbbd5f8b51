import type { Knex } from 'knex';

/** A row about an agent whose `details.agent_name` is missing or is not that agent's name. */
export interface MisnamedRow {
  seq: number;
  kind: string;
  agent_id: string;
  recorded: string | null;
  name: string | null;
}

/**
 * Every audit row with an agent_id must record the agent's name in `details.agent_name` (docs/audit.md):
 * the rows that do not, in seq order. Agents are never renamed, so the name recorded is the current one.
 */
export async function misnamedAgentRows(knex: Knex): Promise<MisnamedRow[]> {
  const rows = (await knex('audit_events as e')
    .joinRaw('left join agents as a on a.id::text = e.agent_id')
    .whereNotNull('e.agent_id')
    .whereRaw("(e.details->>'agent_name') is distinct from a.name")
    .orderBy('e.seq')
    .select(
      'e.seq',
      'e.kind',
      'e.agent_id',
      knex.raw("e.details->>'agent_name' as recorded"),
      'a.name as name',
    )) as MisnamedRow[];
  return rows.map((r) => ({ ...r, seq: Number(r.seq) }));
}
