/** A note as stored: upserted by agent, session and key; readable until it expires. */
export interface Note {
  value: string;
  expires_at: string;
}

/**
 * The notes countersign keeps for an agent, per session: all a memory tool can reach. Tools never touch
 * the database; the store behind this is accounts' (`agent_memory`), and tests give the tools the
 * in-memory twin below.
 */
export interface MemoryStore {
  /** Keeps `value` under the agent, session and key for `ttlS` seconds (replacing what was there). */
  remember(
    agentId: string,
    sessionId: string,
    key: string,
    value: string,
    ttlS: number,
  ): Promise<{ expires_at: string }>;
  /** The note, unless there is none or it has expired. */
  recall(agentId: string, sessionId: string, key: string): Promise<Note | undefined>;
}
