import { figure, type Figure } from '../lib/report.ts';
import { cpuSeconds } from '../lib/proc.ts';
import { callTool, connect, spawnCountersign } from '../lib/server.ts';
import { sleep } from '../lib/stats.ts';

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

/**
 * CPU (user + system, from /proc/<pid>/stat) the server process burns per second while no call
 * arrives: one call to warm it up, SETTLE_S seconds for what that call set in motion, then `seconds`
 * seconds of nothing.
 */
async function idleCpu(
  env: Record<string, string>,
  token: string | RegExp,
  seconds: number,
): Promise<number> {
  const server = await spawnCountersign(env);
  try {
    const tok = typeof token === 'string' ? token : (await server.waitFor(token))[1]!;
    const client = await connect(server.url, tok);
    const { envelope } = await callTool(client, 'isphere_search_contacts', { query: 'alice' });
    if (envelope.ok !== true) throw new Error(`warm-up call failed: ${JSON.stringify(envelope)}`);
    await client.close();
    await sleep(SETTLE_S * 1000);
    const c0 = cpuSeconds(server.pid);
    const t0 = performance.now();
    await sleep(seconds * 1000);
    const used = cpuSeconds(server.pid) - c0;
    return (used * 1000) / ((performance.now() - t0) / 1000);
  } finally {
    await server.stop();
  }
}

/** The idle CPU figure on PostgreSQL and on the embedded database. */
export async function idleFigures(o: IdleOptions): Promise<Figure[]> {
  const pg = await idleCpu({ DATABASE_URL: o.url, COUNTERSIGN_DATA_DIR: o.dataDir }, o.token, o.seconds);
  o.log(`  PostgreSQL: ${pg.toFixed(2)} ms of CPU a second over ${o.seconds} s without calls`);
  // The first start creates the embedded database, the demo data and an agent, and prints its token.
  const lite = await idleCpu(
    { COUNTERSIGN_DATA_DIR: o.pgliteDir, COUNTERSIGN_DEMO: 'true' },
    /demo agent token \(shown once\): (\S+)/,
    o.seconds,
  );
  o.log(`  PGlite:     ${lite.toFixed(2)} ms of CPU a second over ${o.seconds} s without calls`);
  const note = `server process, /proc user+system over ${o.seconds} s, ${SETTLE_S} s after one warm-up call`;
  return [
    figure({ id: 'i_idle_cpu_ms_per_s_postgres', unit: 'ms/s', value: pg, check: { valueAtMost: 2 }, note }),
    figure({ id: 'i_idle_cpu_ms_per_s_pglite', unit: 'ms/s', value: lite, check: { valueAtMost: 2 }, note }),
  ];
}
