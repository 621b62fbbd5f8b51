import type { Knex } from 'knex';

/**
 * The notes an agent keeps per session (the `agent_memory` table; this module is its only user): the
 * memory tools' MemoryStore (src/tools/memory/store.ts, checked where the two are wired together in
 * app/services/pipeline.ts), with the purge the periodic maintenance runs.
 */
export function createAgentMemory(knex: Knex) {
  return {
    async remember(agentId: string, sessionId: string, key: string, value: string, ttlS: number) {
      const now = new Date();
      const expires_at = new Date(now.getTime() + ttlS * 1000).toISOString();
      await knex('agent_memory')
        .insert({
          agent_id: agentId,
          session_id: sessionId,
          key,
          value,
          expires_at,
          updated_at: now.toISOString(),
        })
        .onConflict(['agent_id', 'session_id', 'key'])
        .merge();
      return { expires_at };
    },
    async recall(agentId: string, sessionId: string, key: string) {
      const row = (await knex('agent_memory')
        .select('value', 'expires_at')
        .where({ agent_id: agentId, session_id: sessionId, key })
        .where('expires_at', '>', new Date().toISOString())
        .first()) as { value: string; expires_at: Date | string } | undefined;
      return row && { value: row.value, expires_at: new Date(row.expires_at).toISOString() };
    },
    /** Drops expired notes (run with the periodic maintenance). */
    purge: () => knex('agent_memory').where('expires_at', '<=', new Date().toISOString()).delete(),
  };
}
