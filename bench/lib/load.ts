import type { Client } from '@modelcontextprotocol/client';
import { median, percentile } from './stats.ts';

export interface LoadResult {
  calls: number;
  failures: number;
  /** First failure seen, for the report. */
  firstFailure?: string;
  seconds: number;
  perSecond: number;
  p50: number;
  p99: number;
}

/**
 * A closed loop: every client keeps exactly one call in flight (its own session, its own request ids)
 * for `warmupMs + durationMs`; only calls started after the warm-up are counted.
 * `call` resolves to an error text for a failed call, or undefined.
 */
export async function closedLoop(
  clients: readonly Client[],
  opts: { warmupMs: number; durationMs: number; onMeasureStart?: () => void },
  call: (client: Client, n: number) => Promise<string | undefined>,
): Promise<LoadResult> {
  const start = performance.now();
  const measureFrom = start + opts.warmupMs;
  const mark = setTimeout(() => opts.onMeasureStart?.(), opts.warmupMs);
  const end = measureFrom + opts.durationMs;
  const latencies: number[] = [];
  let failures = 0;
  let firstFailure: string | undefined;
  let lastDone = measureFrom;
  await Promise.all(
    clients.map(async (client) => {
      for (let n = 0; performance.now() < end; n++) {
        const t0 = performance.now();
        let failure: string | undefined;
        try {
          failure = await call(client, n);
        } catch (err) {
          failure = String(err);
        }
        const t1 = performance.now();
        if (t0 < measureFrom) continue;
        lastDone = Math.max(lastDone, t1);
        latencies.push(t1 - t0);
        if (failure) {
          failures++;
          firstFailure ??= failure;
        }
      }
    }),
  );
  clearTimeout(mark);
  const seconds = (lastDone - measureFrom) / 1000;
  return {
    calls: latencies.length,
    failures,
    firstFailure,
    seconds,
    perSecond: latencies.length / seconds,
    p50: median(latencies),
    p99: percentile(latencies, 99),
  };
}
