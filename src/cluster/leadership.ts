import pg from 'pg';
import type { Logger } from '../log.ts';

/** The advisory-lock key of the replica that runs the cluster's periodic work ('csleader' in ASCII). */
const LEADER_LOCK_KEY = 0x63736c6561646572n;

export interface Leadership {
  /** Whether this replica runs the cluster's periodic work right now. */
  isLeader(): boolean;
  /** Calls `listener` each time this replica becomes the leader (at once, if it leads already). */
  onLead(listener: () => void): void;
  close(): Promise<void>;
}

/**
 * One replica of a cluster leads: it holds a session-level advisory lock on a connection of its own, and
 * runs expiry, reconciliation, checkpoint signing and notification delivery. The others try for the lock
 * every `retryMs`; when the leader's connection ends (a crash, a kill, a network cut) PostgreSQL releases
 * the lock and the next try elsewhere takes it over.
 *
 * The leader itself does not poll: a session lock stays held as long as its connection, and the end of
 * that connection (the server gone, the backend terminated, the socket reset) reaches the client as an
 * `error` event at once, which ends the lead and starts the tries again. A check query would add nothing:
 * on a connection cut without a reset it would hang as long as the socket does, and PostgreSQL keeps the
 * lock for that backend meanwhile, so no other replica could lead either.
 */
export async function createLeadership(url: string, log: Logger, retryMs = 2_000): Promise<Leadership> {
  let client: pg.Client | undefined;
  let leader = false;
  let closed = false;
  let timer: NodeJS.Timeout | undefined;
  const listeners: (() => void)[] = [];

  /** The next try, unless one is set or this replica leads (nothing to try for then). */
  const schedule = () => {
    if (closed || leader || timer) return;
    timer = setTimeout(() => {
      timer = undefined;
      void attempt().finally(schedule);
    }, retryMs);
    timer.unref();
  };

  async function attempt() {
    try {
      if (!client) {
        const c = new pg.Client({ connectionString: url, keepAlive: true });
        c.on('error', (err) => {
          if (leader) log.warn({ err: err.message }, 'lost the leader lock connection');
          leader = false;
          if (client === c) client = undefined;
          void c.end().catch(() => undefined);
          schedule();
        });
        await c.connect();
        client = c;
      }
      const { rows } = await client.query<{ locked: boolean }>('select pg_try_advisory_lock($1) as locked', [
        LEADER_LOCK_KEY.toString(),
      ]);
      const now = rows[0]?.locked === true;
      const gained = now && !leader;
      leader = now && !closed;
      if (gained && leader) {
        log.info('this replica leads the cluster: it runs the periodic work');
        for (const l of listeners) l();
      }
    } catch (err) {
      leader = false;
      log.warn({ err: (err as Error).message }, 'leader lock attempt failed');
      const c = client;
      client = undefined;
      await c?.end().catch(() => undefined);
    }
  }
  await attempt();
  schedule();

  return {
    isLeader: () => leader,
    onLead(listener) {
      listeners.push(listener);
      if (leader) listener();
    },
    async close() {
      closed = true;
      clearTimeout(timer);
      leader = false;
      await client?.end().catch(() => undefined);
    },
  };
}

/** One process (PGlite) is its own cluster: it always leads. */
export const soleLeader: Leadership = {
  isLeader: () => true,
  onLead: (listener) => listener(),
  close: async () => undefined,
};
