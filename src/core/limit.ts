/**
 * At most `n` of the calls given run at once; the rest wait in order, each starting as soon as one
 * before it ends (however it ends).
 */
export function limitConcurrency(n: number): <T>(work: () => Promise<T>) => Promise<T> {
  let running = 0;
  const waiting: (() => void)[] = [];
  return async (work) => {
    if (running >= n) await new Promise<void>((turn) => waiting.push(turn));
    else running++;
    try {
      return await work();
    } finally {
      // The place passes straight to the next in line, or is given back.
      const next = waiting.shift();
      if (next) next();
      else running--;
    }
  };
}
