import { spawnCountersign, type Child } from '../lib/server.ts';

export interface Cluster {
  /** URLs of the servers that are up right now. */
  live(): string[];
  /** Children that are up, by slot. */
  children(): (Child | undefined)[];
  /** SIGKILLs the server in `slot`; it stays down until restart(slot). */
  kill(slot: number): Promise<void>;
  restart(slot: number): Promise<void>;
  /** Starts every slot that is down. */
  heal(): Promise<void>;
  stop(): Promise<void>;
  /** Every server's stderr so far (for the report when something went wrong). */
  logs(): string;
}

/** `size` countersign servers on one database, each its own process, restartable. */
export async function startCluster(size: number, env: Record<string, string>): Promise<Cluster> {
  const slots: (Child | undefined)[] = new Array<Child | undefined>(size).fill(undefined);
  const past: string[] = [];
  const start = async (slot: number) => {
    slots[slot] = await spawnCountersign(env);
  };
  await Promise.all(slots.map((_, i) => start(i)));
  return {
    live: () => slots.filter((c): c is Child => !!c).map((c) => c.url),
    children: () => [...slots],
    async kill(slot) {
      const child = slots[slot];
      slots[slot] = undefined;
      if (child) {
        past.push(child.stderr());
        await child.stop('SIGKILL');
      }
    },
    restart: start,
    async heal() {
      await Promise.all(slots.map((c, i) => (c ? undefined : start(i))));
    },
    async stop() {
      await Promise.all(
        slots.map(async (c) => {
          if (c) past.push(c.stderr());
          await c?.stop();
        }),
      );
      slots.fill(undefined);
    },
    logs: () => [...past, ...slots.map((c) => c?.stderr() ?? '')].join('\n'),
  };
}
