import type { Knex } from 'knex';

/** An agent's own notes: upsert by key, read back until they expire. */
export function createMemoryStore(knex: Knex) {
  return {
    async remember(agentId: string, key: string, value: unknown, ttlS: number) {
      const now = new Date();
      const expires_at = new Date(now.getTime() + ttlS * 1000).toISOString();
      await knex('agent_memory')
        .insert({
          agent_id: agentId,
          key,
          // Wrapped, so the column always holds an object and a string value is not mistaken for JSON text.
          value: JSON.stringify({ v: value }),
          expires_at,
          updated_at: now.toISOString(),
        })
        .onConflict(['agent_id', 'key'])
        .merge();
      return { expires_at };
    },
    async recall(agentId: string, key: string): Promise<{ value: unknown; expires_at: string } | undefined> {
      const row = (await knex('agent_memory')
        .where({ agent_id: agentId, key })
        .where('expires_at', '>', new Date().toISOString())
        .first()) as { value: unknown; expires_at: unknown } | undefined;
      if (!row) return undefined;
      return {
        value: ((typeof row.value === 'string' ? JSON.parse(row.value) : row.value) as { v: unknown }).v,
        expires_at: new Date(row.expires_at as string).toISOString(),
      };
    },
    /** Drops expired notes (run with the periodic maintenance). */
    purge: () => knex('agent_memory').where('expires_at', '<=', new Date().toISOString()).delete(),
  };
}
export type MemoryStore = ReturnType<typeof createMemoryStore>;
