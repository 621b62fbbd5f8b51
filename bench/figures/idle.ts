import { figure, type Figure } from '../lib/report.ts';
import { cpuSecondsFine } from '../lib/proc.ts';
import { callTool, connect, spawnCountersign } from '../lib/server.ts';
import { median, sleep } from '../lib/stats.ts';

export interface IdleOptions {
  /** The seeded PostgreSQL database and its data directory. */
  url: string;
  dataDir: string;
  token: string;
  /** A data directory for the embedded database (PGlite), made here by a first start with the demo. */
  pgliteDir: string;
  /** Seconds of idle measured per server, after the warm-up. */
  seconds: number;
  log(line: string): void;
}

/** Seconds a server is left alone after its warm-up call before the idle window opens. */
const SETTLE_S = 5;
/** The window is read in slices of this many seconds. */
const SLICE_S = 5;

/**
 * CPU (every thread's run time, from /proc/<pid>/task/<tid>/schedstat) the server process burns per second while no call
 * arrives: one call to warm it up, SETTLE_S seconds for what that call set in motion, then `seconds`
 * seconds of nothing, read in SLICE_S-second slices. `per_s` is the median slice, what an idle server
 * spends every second; `mean_per_s` the whole window's, which also holds what happens once: V8's
 * memory reducer, when the process goes quiet, makes two or three full collections that compact the
 * heap start-up left and give its pages back (140-180 ms of CPU, some 15-40 s after start, then not
 * again while idle; docs/performance.md), and where it falls depends on how long start-up took.
 */
async function idleCpu(
  env: Record<string, string>,
  token: string | RegExp,
  seconds: number,
): Promise<{ per_s: number; mean_per_s: number }> {
  const server = await spawnCountersign(env);
  try {
    const tok = typeof token === 'string' ? token : (await server.waitFor(token))[1]!;
    const client = await connect(server.url, tok);
    const { envelope } = await callTool(client, 'isphere_search_contacts', { query: 'alice' });
    if (envelope.ok !== true) throw new Error(`warm-up call failed: ${JSON.stringify(envelope)}`);
    await client.close();
    await sleep(SETTLE_S * 1000);
    const slices: number[] = [];
    const [c0, t0] = [cpuSecondsFine(server.pid), performance.now()];
    let [c, t] = [c0, t0];
    while (t - t0 < seconds * 1000) {
      await sleep(SLICE_S * 1000);
      const [c1, t1] = [cpuSecondsFine(server.pid), performance.now()];
      slices.push(((c1 - c) * 1000) / ((t1 - t) / 1000));
      [c, t] = [c1, t1];
    }
    return { per_s: median(slices), mean_per_s: ((c - c0) * 1000) / ((t - t0) / 1000) };
  } finally {
    await server.stop();
  }
}

const describe = (name: string, r: { per_s: number; mean_per_s: number }, seconds: number) =>
  `  ${name} ${r.per_s.toFixed(2)} ms of CPU a second (the median ${SLICE_S} s slice of ${seconds} s ` +
  `without calls; ${r.mean_per_s.toFixed(2)} over the whole window)`;

/** The idle CPU figure on PostgreSQL and on the embedded database. */
export async function idleFigures(o: IdleOptions): Promise<Figure[]> {
  const pg = await idleCpu({ DATABASE_URL: o.url, COUNTERSIGN_DATA_DIR: o.dataDir }, o.token, o.seconds);
  o.log(describe('PostgreSQL:', pg, o.seconds));
  // The first start creates the embedded database, the demo data and an agent, and prints its token.
  const lite = await idleCpu(
    { COUNTERSIGN_DATA_DIR: o.pgliteDir, COUNTERSIGN_DEMO: 'true' },
    /demo agent token \(shown once\): (\S+)/,
    o.seconds,
  );
  o.log(describe('PGlite:    ', lite, o.seconds));
  const note = `server process, every thread's run time (schedstat): the median ${SLICE_S} s slice of ${o.seconds} s, ${SETTLE_S} s after one warm-up call`;
  const mean = `the same window's mean, with whatever happens once in it (V8's memory reducer)`;
  return [
    figure({
      id: 'i_idle_cpu_ms_per_s_postgres',
      unit: 'ms/s',
      value: pg.per_s,
      check: { valueAtMost: 2 },
      note,
    }),
    figure({
      id: 'i_idle_cpu_ms_per_s_pglite',
      unit: 'ms/s',
      value: lite.per_s,
      check: { valueAtMost: 2 },
      note,
    }),
    figure({
      id: 'i_idle_mean_ms_per_s_postgres',
      unit: 'ms/s',
      value: pg.mean_per_s,
      check: null,
      note: mean,
    }),
    figure({
      id: 'i_idle_mean_ms_per_s_pglite',
      unit: 'ms/s',
      value: lite.mean_per_s,
      check: null,
      note: mean,
    }),
  ];
}
