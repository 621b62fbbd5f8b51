/**
 * The pace at which one key is refused — a source address (audit refusals), an agent (RATE_LIMITED,
 * src/server/call.ts): at most `perSecond` refusals a second, after a burst of as many, each one past
 * that waiting its turn before it is answered. A flood of bad tokens, forged
 * Slack callbacks or sign-on callbacks from one address is then answered as fast as the pace allows,
 * not as fast as it is sent: a client that waits for each answer before it sends the next (most
 * floods) is slowed to the pace, and what it costs the server (the token lookup, the answer) with it.
 * Well-behaved callers from the same address are not held: only refusals wait.
 *
 * The generic cell rate algorithm: per address one number, the time at which its next refusal is
 * "due"; a refusal may go that far ahead of due by the burst, and waits for the rest.
 */
export interface Pace {
  /** Resolves when this refusal of `source` may be answered (at once within the pace). */
  wait(source: string): Promise<void>;
  /** How many refusals are waiting now, over all addresses. */
  waiting(): number;
  /** Lets every waiting refusal go at once (on a stop: nobody waits for a pace that no longer matters). */
  release(): void;
}

export interface PaceOptions {
  /** Refusals a second per address, after a burst of as many; 0: not paced. */
  perSecond: number;
  /** Refusals of one address waiting at once; past it a refusal is answered at once (counted as ever). */
  maxWaiting?: number;
  /** The clock (ms); tests pass their own. */
  now?: () => number;
}

const MAX_ADDRESSES = 10_000;

export function createPace(opts: PaceOptions): Pace {
  const now = opts.now ?? (() => performance.now());
  const maxWaiting = opts.maxWaiting ?? 1000;
  /** Per address: when its next refusal is due, and how many of its refusals wait. */
  const due = new Map<string, { at: number; waiting: number }>();
  let waiting = 0;
  const held = new Map<NodeJS.Timeout, () => void>();
  const release = () => {
    for (const [timer, go] of held) {
      clearTimeout(timer);
      go();
    }
    held.clear();
  };
  if (opts.perSecond <= 0) return { wait: async () => undefined, waiting: () => 0, release };
  const interval = 1000 / opts.perSecond;
  const burst = (opts.perSecond - 1) * interval;

  /** Forgets the addresses that are due already: they are as good as new. */
  const sweep = (t: number) => {
    for (const [source, d] of due) if (d.at <= t && d.waiting === 0) due.delete(source);
  };

  return {
    async wait(source) {
      const t = now();
      if (due.size >= MAX_ADDRESSES) sweep(t);
      const d = due.get(source) ?? { at: t, waiting: 0 };
      due.set(source, d);
      const at = Math.max(d.at, t);
      const hold = at - burst - t;
      if (hold > 0 && d.waiting >= maxWaiting) return;
      d.at = at + interval;
      if (hold <= 0) return;
      d.waiting++;
      waiting++;
      try {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(() => {
            held.delete(timer);
            resolve();
          }, hold);
          held.set(timer, resolve);
        });
      } finally {
        d.waiting--;
        waiting--;
      }
    },
    waiting: () => waiting,
    release,
  };
}
