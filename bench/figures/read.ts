import type { Client } from '@modelcontextprotocol/client';
import { closedLoop, type LoadResult } from '../lib/load.ts';
import { cpuSeconds, statusMb } from '../lib/proc.ts';
import { figure, type Figure } from '../lib/report.ts';
import { callTool, connect, spawnBareServer, spawnCountersign, type Child } from '../lib/server.ts';
import { median } from '../lib/stats.ts';

export interface ReadOptions {
  url: string;
  dataDir: string;
  token: string;
  clients: number;
  /** Seconds of measured load per server, split into alternating segments. */
  seconds: number;
  segments: number;
  log(line: string): void;
}

const QUERY = { query: 'mar', limit: 10 };

interface Side {
  name: string;
  server: Child;
  clients: Client[];
  call(client: Client): Promise<string | undefined>;
  results: LoadResult[];
  cpu: number;
}

function combine(results: LoadResult[]): { perSecond: number; calls: number; failures: number } {
  const calls = results.reduce((s, r) => s + r.calls, 0);
  const seconds = results.reduce((s, r) => s + r.seconds, 0);
  return { perSecond: calls / seconds, calls, failures: results.reduce((s, r) => s + r.failures, 0) };
}

/**
 * Sequential calls from one client — latency without queueing — in `rounds` alternating rounds of
 * `n` calls per side, so that drift on a shared machine hits both alike; the p50 of each side.
 */
async function sequential(sides: Side[], n: number, rounds: number): Promise<number[]> {
  const samples: number[][] = sides.map(() => []);
  for (let r = 0; r < rounds; r++) {
    for (const [i, side] of sides.entries()) {
      for (let k = 0; k < n; k++) {
        const t0 = performance.now();
        await side.call(side.clients[0]!);
        samples[i]!.push(performance.now() - t0);
      }
    }
  }
  return samples.map(median);
}

/**
 * (a) audited read calls/s and latency, 16 clients, countersign vs a bare SDK server on the same query;
 * (g) the countersign process's peak RSS under that load. Both servers run as child processes at once
 * and are loaded in alternating segments, so drift on a shared machine hits both alike.
 */
export async function readFigures(o: ReadOptions): Promise<Figure[]> {
  const bareServer = await spawnBareServer({ DATABASE_URL: o.url });
  const csServer = await spawnCountersign({ DATABASE_URL: o.url, COUNTERSIGN_DATA_DIR: o.dataDir });
  try {
    const bare: Side = {
      name: 'bare',
      server: bareServer,
      clients: await Promise.all(Array.from({ length: o.clients }, () => connect(bareServer.url))),
      call: async (client) => {
        const { isError } = await callTool(client, 'search_contacts', QUERY);
        return isError ? 'bare server answered an error' : undefined;
      },
      results: [],
      cpu: 0,
    };
    const cs: Side = {
      name: 'countersign',
      server: csServer,
      clients: await Promise.all(Array.from({ length: o.clients }, () => connect(csServer.url, o.token))),
      call: async (client) => {
        const { envelope } = await callTool(client, 'isphere_search_contacts', QUERY);
        return envelope.ok === true ? undefined : JSON.stringify(envelope.error ?? envelope).slice(0, 300);
      },
      results: [],
      cpu: 0,
    };
    const sides = [bare, cs];
    const segmentMs = (o.seconds * 1000) / o.segments;
    for (let s = 0; s < o.segments; s++) {
      for (const side of s % 2 === 0 ? sides : [...sides].reverse()) {
        let cpu0 = cpuSeconds(side.server.pid);
        const r = await closedLoop(
          side.clients,
          {
            warmupMs: Math.min(2000, segmentMs / 4),
            durationMs: segmentMs,
            onMeasureStart: () => (cpu0 = cpuSeconds(side.server.pid)),
          },
          (c) => side.call(c),
        );
        side.cpu += cpuSeconds(side.server.pid) - cpu0;
        side.results.push(r);
        o.log(
          `  ${side.name.padEnd(11)} segment ${s + 1}/${o.segments}: ${r.perSecond.toFixed(0)} calls/s, ` +
            `p50 ${r.p50.toFixed(2)} ms, p99 ${r.p99.toFixed(2)} ms, ${r.failures} failed${r.firstFailure ? ` (${r.firstFailure})` : ''}`,
        );
      }
    }
    const [seqBare, seqCs] = (await sequential(sides, 100, 4)) as [number, number];
    const rssCs = statusMb(csServer.pid, 'VmHWM');
    const rssBare = statusMb(bareServer.pid, 'VmHWM');
    await Promise.allSettled([...bare.clients, ...cs.clients].map((c) => c.close()));

    const b = combine(bare.results);
    const c = combine(cs.results);
    const lat = (side: Side, p: 'p50' | 'p99') => median(side.results.map((r) => r[p]));
    const failed = c.failures + b.failures;
    const note = failed > 0 ? `${c.failures} countersign and ${b.failures} baseline calls failed` : undefined;
    return [
      figure({
        id: 'a_read_throughput',
        unit: 'calls/s',
        value: failed > 0 ? Number.NaN : c.perSecond,
        baseline: b.perSecond,
        baseline_label: `bare MCP SDK server, same query, ${o.clients} clients`,
        check: { ratioAtLeast: 0.8 },
        note,
      }),
      // The added latency of docs/performance.md: one client calling sequentially, countersign minus the bare server.
      figure({
        id: 'a_read_p50_added_1client_ms',
        unit: 'ms',
        value: seqCs - seqBare,
        baseline: seqBare,
        baseline_label: 'bare server p50 latency (ms), one client, one call at a time',
        ratio: seqCs / seqBare,
        check: { valueAtMost: 1 },
      }),
      figure({
        id: 'a_read_p50_overhead_ms',
        unit: 'ms',
        value: lat(cs, 'p50') - lat(bare, 'p50'),
        baseline: lat(bare, 'p50'),
        baseline_label: `bare server p50 latency (ms) under the same load (${o.clients} clients)`,
        ratio: lat(cs, 'p50') / lat(bare, 'p50'),
        check: null,
      }),
      figure({
        id: 'a_read_p99_overhead_ms',
        unit: 'ms',
        value: lat(cs, 'p99') - lat(bare, 'p99'),
        baseline: lat(bare, 'p99'),
        baseline_label: 'bare server p99 latency (ms) under the same load',
        ratio: lat(cs, 'p99') / lat(bare, 'p99'),
        check: null,
      }),
      figure({
        id: 'a_server_cpu_ms_per_call',
        unit: 'ms',
        value: (cs.cpu * 1000) / c.calls,
        baseline: (bare.cpu * 1000) / b.calls,
        baseline_label: 'bare server CPU per call',
        check: null,
      }),
      figure({
        id: 'g_server_rss_mb',
        unit: 'MB',
        value: rssCs,
        baseline: rssBare,
        baseline_label: 'bare server peak RSS under the same load',
        check: { valueAtMost: 200 },
      }),
    ];
  } finally {
    await Promise.allSettled([bareServer.stop(), csServer.stop()]);
  }
}
