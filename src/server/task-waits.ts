import type { ClusterBus } from '../cluster/bus.ts';

/*
 * What a long wait on a task (tasks/result) waits on: the change announcements the cluster already
 * sends (ClusterBus.onTaskChanged, from the task change trigger on PostgreSQL), one subscription for
 * every waiter of the replica, rather than each waiter reading the database on a timer. A waiter is
 * woken when its task (or, after a lost connection, any task) is announced; while announcements reach
 * the replica it reads again on its own only every SAFETY_READ_MS, to make up for a lost one. Where
 * nothing is announced (the embedded database, or the listening connection down), it reads again
 * each poll interval, as before.
 */

/** While announcements arrive, how long a waiter goes without reading its task anyway. */
const SAFETY_READ_MS = 10_000;

export interface TaskWaits {
  /**
   * Resolves once task `taskId` may have changed (announced), or at the latest after `at_most_ms`, the
   * fallback read's interval, or the signal's abort, whichever comes first.
   */
  next(taskId: string, at_most_ms: number, signal: AbortSignal): Promise<void>;
  /** Wakes every waiter and stops listening. */
  close(): void;
}

export function createTaskWaits(
  bus: Pick<ClusterBus, 'onTaskChanged' | 'listening'>,
  poll_ms: number,
): TaskWaits {
  const waiters = new Map<string, Set<() => void>>();
  const wake = (taskId: string) => {
    const woken = taskId === '*' ? [...waiters.values()] : [waiters.get(taskId) ?? new Set()];
    for (const set of woken) for (const w of [...set]) w();
  };
  const unsubscribe = bus.onTaskChanged(wake);
  return {
    next(taskId, at_most_ms, signal) {
      if (signal.aborted) return Promise.resolve();
      return new Promise<void>((resolve) => {
        const fallback = bus.listening() ? SAFETY_READ_MS : poll_ms;
        const done = () => {
          clearTimeout(timer);
          signal.removeEventListener('abort', done);
          const set = waiters.get(taskId);
          set?.delete(done);
          if (set?.size === 0) waiters.delete(taskId);
          resolve();
        };
        const timer = setTimeout(done, Math.max(0, Math.min(at_most_ms, fallback)));
        signal.addEventListener('abort', done, { once: true });
        let set = waiters.get(taskId);
        if (!set) waiters.set(taskId, (set = new Set()));
        set.add(done);
      });
    },
    close() {
      unsubscribe();
      wake('*');
    },
  };
}
