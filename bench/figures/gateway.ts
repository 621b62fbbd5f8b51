import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import type { CallToolResult } from '@modelcontextprotocol/client';
import { closedLoop, type LoadResult } from '../lib/load.ts';
import { FS_SERVER, fsUpstream, ONE_KIB } from '../lib/fs-upstream.ts';
import { cpuSeconds, processTree, treeStatusMb } from '../lib/proc.ts';
import { figure, type Figure } from '../lib/report.ts';
import { callTool, connect, spawnCountersign, untilAnswered } from '../lib/server.ts';
import { median } from '../lib/stats.ts';
import { spawnMcpProxy } from '../lib/mcp-proxy.ts';
import { spawnSupergateway } from '../lib/supergateway.ts';

export interface GatewayOptions {
  url: string;
  dataDir: string;
  token: string;
  clients: number;
  /** Seconds of measured load per gateway, split into alternating segments. */
  seconds: number;
  segments: number;
  /** Sequential calls per side for the 1-client p50 (interleaved over the sides). */
  sequentialCalls: number;
  /**
   * A fresh data directory: countersign on its embedded database (PGlite, the default) runs beside the
   * others, made there by a first start with the demo (its token read from the banner).
   */
  pgliteDir?: string;
  log(line: string): void;
}

/** One way of reading the file: a gateway with its clients, or the filesystem server called directly. */
interface Side {
  name: string;
  /** The process whose tree is the gateway (none for the direct calls). */
  pid?: number;
  clients: Client[];
  call(client: Client): Promise<string | undefined>;
  results: LoadResult[];
  /** CPU seconds its process tree used in the measured part of its load segments. */
  cpu: number;
}

/** CPU seconds (user + system) used so far by `pid` and its descendants. */
const treeCpu = (pid: number | undefined) =>
  pid === undefined ? 0 : processTree(pid).reduce((s, p) => s + (cpuSeconds(p) || 0), 0);

const textOf = (content: unknown) => (content as { text?: unknown }[] | undefined)?.[0]?.text;

/** An MCP result carrying the file, or what was wrong with it. */
function checkResult(result: CallToolResult): string | undefined {
  if (result.isError) return `error result: ${JSON.stringify(result.content).slice(0, 300)}`;
  return textOf(result.content) === ONE_KIB ? undefined : 'the answer is not the file';
}

async function readRaw(client: Client, file: string): Promise<string | undefined> {
  const result = (await client.callTool({
    name: 'read_text_file',
    arguments: { path: file },
  })) as CallToolResult;
  return checkResult(result);
}

async function readThroughCountersign(
  client: Client,
  tool: string,
  file: string,
): Promise<string | undefined> {
  const { envelope } = await callTool(client, tool, { path: file });
  if (envelope.ok !== true) return JSON.stringify(envelope.error ?? envelope).slice(0, 300);
  return textOf(envelope.content) === ONE_KIB ? undefined : 'the envelope does not carry the file';
}

/** The filesystem server as a child of this process, spoken to over stdio by the SDK's client. */
async function connectDirect(root: string): Promise<Client> {
  const client = new Client({ name: 'countersign-bench', version: '1.0.0' });
  await client.connect(
    new StdioClientTransport({ command: process.execPath, args: [FS_SERVER, root], stderr: 'ignore' }),
  );
  return client;
}

/** The closed-loop load in `segments` rounds, the order of the sides reversed every other round. */
async function alternate(sides: Side[], o: GatewayOptions): Promise<void> {
  const segmentMs = (o.seconds * 1000) / o.segments;
  for (let s = 0; s < o.segments; s++) {
    for (const side of s % 2 === 0 ? sides : [...sides].reverse()) {
      let c0 = 0;
      const r = await closedLoop(
        side.clients,
        {
          warmupMs: Math.min(2000, segmentMs / 4),
          durationMs: segmentMs,
          onMeasureStart: () => (c0 = treeCpu(side.pid)),
        },
        (c) => side.call(c),
      );
      side.cpu += treeCpu(side.pid) - c0;
      side.results.push(r);
      o.log(
        `  ${side.name.padEnd(12)} segment ${s + 1}/${o.segments}: ${r.perSecond.toFixed(0)} calls/s, ` +
          `p50 ${r.p50.toFixed(2)} ms, p99 ${r.p99.toFixed(2)} ms, ${r.failures} failed` +
          (r.firstFailure ? ` (${r.firstFailure})` : ''),
      );
    }
  }
}

/**
 * One client per side calling sequentially (no queueing): `calls` reads of each side, interleaved call
 * by call — the first side rotating — so that the drift of a shared machine hits every side alike.
 * Each side's p50, and the first failure seen (a failed call's time is not a read's).
 */
async function sequentialP50(sides: Side[], calls: number) {
  const samples: number[][] = sides.map(() => []);
  let failure: string | undefined;
  for (let k = 0; k < calls; k++) {
    for (let j = 0; j < sides.length; j++) {
      const i = (k + j) % sides.length;
      const side = sides[i]!;
      const t0 = performance.now();
      const failed = await side.call(side.clients[0]!).catch((err: unknown) => String(err));
      if (failed) failure ??= `${side.name}: ${failed}`;
      else samples[i]!.push(performance.now() - t0);
    }
  }
  return { p50: samples.map(median), failure };
}

function throughput(side: Side) {
  const calls = side.results.reduce((s, r) => s + r.calls, 0);
  const seconds = side.results.reduce((s, r) => s + r.seconds, 0);
  return {
    perSecond: calls / seconds,
    failures: side.results.reduce((s, r) => s + r.failures, 0),
    cpuMsPerCall: (side.cpu * 1000) / calls,
  };
}

const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

/**
 * (h) countersign against supergateway 4.0.0 and mcp-proxy 6.7.19, all in front of the same filesystem
 * server, proxying `read_text_file` of a 1 KiB file over Streamable HTTP: throughput with `clients`
 * clients (segments alternated between the gateways), CPU of each gateway's process tree per call under
 * that load, and each gateway's added p50 latency for one sequential client over the same read made
 * directly over stdio.
 */
export async function gatewayFigures(o: GatewayOptions): Promise<Figure[]> {
  const ws = fsUpstream('bench-gateway');
  const stops: (() => Promise<void>)[] = [];
  try {
    const cs = await spawnCountersign({
      DATABASE_URL: o.url,
      COUNTERSIGN_DATA_DIR: o.dataDir,
      COUNTERSIGN_CONFIG: ws.config,
    });
    stops.push(() => cs.stop());
    const sg = await spawnSupergateway([process.execPath, FS_SERVER, ws.root].map(quote).join(' '));
    stops.push(() => sg.stop());
    const mp = await spawnMcpProxy([process.execPath, FS_SERVER, ws.root]);
    stops.push(() => mp.stop());
    const lite = o.pgliteDir
      ? await spawnCountersign({
          COUNTERSIGN_DATA_DIR: o.pgliteDir,
          COUNTERSIGN_DEMO: 'true',
          COUNTERSIGN_CONFIG: ws.config,
        })
      : undefined;
    if (lite) stops.push(() => lite.stop());
    const liteToken = lite && (await lite.waitFor(/demo agent token \(shown once\): (\S+)/))[1]!;
    const connectAll = (url: string, token?: string) =>
      Promise.all(Array.from({ length: o.clients }, () => connect(url, token)));
    const peer = async (name: string, g: { pid: number; url: string }): Promise<Side> => ({
      name,
      pid: g.pid,
      clients: await connectAll(g.url),
      results: [],
      cpu: 0,
      call: (c) => readRaw(c, ws.file),
    });
    const sides: Side[] = [
      {
        name: 'countersign',
        pid: cs.pid,
        clients: await connectAll(cs.url, o.token),
        results: [],
        cpu: 0,
        call: (c) => readThroughCountersign(c, `${ws.name}__read_text_file`, ws.file),
      },
      await peer('supergateway', sg),
      await peer('mcp-proxy', mp),
      ...(lite
        ? [
            {
              name: 'cs-pglite',
              pid: lite.pid,
              clients: await connectAll(lite.url, liteToken),
              results: [],
              cpu: 0,
              call: (c: Client) => readThroughCountersign(c, `${ws.name}__read_text_file`, ws.file),
            },
          ]
        : []),
    ];
    stops.push(() =>
      Promise.allSettled(sides.flatMap((s) => s.clients.map((c) => c.close()))).then(() => {}),
    );
    for (const side of sides) await untilAnswered(side.name, () => side.call(side.clients[0]!));
    const directClient = await connectDirect(ws.root);
    stops.push(() => directClient.close());
    const direct: Side = {
      name: 'direct',
      clients: [directClient],
      results: [],
      cpu: 0,
      call: (c) => readRaw(c, ws.file),
    };
    await alternate(sides, o);
    const sequential = await sequentialP50([direct, ...sides], o.sequentialCalls);
    // Measured before anything closes: every session's child is still up, the trees are whole.
    const rss = sides.map((side) => treeStatusMb(side.pid!, 'VmHWM'));
    return figures(sides, sequential, rss, o);
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
    ws.dispose();
  }
}

const PEERS = {
  supergateway: 'supergateway 4.0.0 --stateful (a child per session, no auth, no audit)',
  'mcp-proxy': 'mcp-proxy 6.7.19 --server stream, stateful (a child per session, no auth, no audit)',
} as const;

/** Countersign's figures against one peer: throughput, added p50, CPU per call, tree peak RSS. */
function peerFigures(
  id: string,
  peer: keyof typeof PEERS,
  cs: { t: ReturnType<typeof throughput>; added: number; rss: { mb: number; processes: number } },
  other: { t: ReturnType<typeof throughput>; added: number; rss: { mb: number; processes: number } },
  o: GatewayOptions,
  failure: string | undefined,
): Figure[] {
  const failed = cs.t.failures + other.t.failures;
  return [
    figure({
      id: `h_vs_${id}_throughput`,
      unit: 'calls/s',
      value: failed > 0 ? Number.NaN : cs.t.perSecond,
      baseline: other.t.perSecond,
      baseline_label: `${PEERS[peer]}, same 1 KiB read_text_file, ${o.clients} clients`,
      check: { ratioAtLeast: 1.0 },
      note:
        failed > 0 ? `${cs.t.failures} countersign and ${other.t.failures} ${peer} calls failed` : undefined,
    }),
    figure({
      id: `h_vs_${id}_added_p50`,
      unit: 'ms',
      value: failure ? Number.NaN : cs.added,
      baseline: other.added,
      baseline_label: `${peer}'s added p50 (ms) over the same read made directly over stdio by the SDK client, one client, sequential`,
      ratio: cs.added / other.added,
      check: { ratioAtMost: peer === 'mcp-proxy' ? 1.0 : 1.5 },
      note: failure && `a sequential call failed: ${failure.slice(0, 300)}`,
    }),
    figure({
      id: `h_vs_${id}_cpu_ms_per_call`,
      unit: 'ms',
      value: cs.t.cpuMsPerCall,
      baseline: other.t.cpuMsPerCall,
      baseline_label: `${peer}'s process tree, CPU (user + system) per call at ${o.clients} clients; countersign's without its database`,
      check: null,
    }),
    figure({
      id: `h_vs_${id}_tree_peak_rss_mb`,
      unit: 'MB',
      value: cs.rss.mb,
      baseline: other.rss.mb,
      baseline_label: `${peer}'s process tree (${other.rss.processes} processes; countersign's: ${cs.rss.processes}), each process's VmHWM summed`,
      check: null,
    }),
  ];
}

function figures(
  sides: Side[],
  sequential: { p50: number[]; failure?: string },
  rss: { mb: number; processes: number }[],
  o: GatewayOptions,
): Figure[] {
  const [pDirect, ...p50s] = sequential.p50 as [number, ...number[]];
  const of = (i: number) => ({ t: throughput(sides[i]!), added: p50s[i]! - pDirect, rss: rss[i]! });
  const [cs, sg, mp] = [of(0), of(1), of(2)];
  o.log(
    `  sequential p50: direct ${pDirect.toFixed(3)} ms, ` +
      sides.map((s, i) => `${s.name} ${p50s[i]!.toFixed(3)} ms`).join(', '),
  );
  o.log(
    '  CPU ms/call at load: ' +
      sides.map((s, i) => `${s.name} ${of(i).t.cpuMsPerCall.toFixed(2)}`).join(', ') +
      '; peak RSS (tree): ' +
      sides.map((s, i) => `${s.name} ${rss[i]!.mb.toFixed(0)} MB`).join(', '),
  );
  return [
    ...peerFigures('supergateway', 'supergateway', cs, sg, o, sequential.failure),
    ...peerFigures('mcp_proxy', 'mcp-proxy', cs, mp, o, sequential.failure),
    ...(sides[3] ? pgliteFigures(of(3), cs, o, sequential.failure) : []),
  ];
}

/**
 * The embedded database beside PostgreSQL, the same server in front of the same read: throughput at
 * `clients`, the added p50 of one sequential client, and the peak RSS of its process tree (issue
 * targets: ≥ 0.8× PostgreSQL's throughput, ≤ 1.2× its added latency, ≤ 200 MB).
 */
function pgliteFigures(
  lite: { t: ReturnType<typeof throughput>; added: number; rss: { mb: number; processes: number } },
  pg: { t: ReturnType<typeof throughput>; added: number },
  o: GatewayOptions,
  failure: string | undefined,
): Figure[] {
  const failed = lite.t.failures + pg.t.failures;
  return [
    figure({
      id: 'h_pglite_vs_postgres_throughput',
      unit: 'calls/s',
      value: failed > 0 ? Number.NaN : lite.t.perSecond,
      baseline: pg.t.perSecond,
      baseline_label: `countersign on PostgreSQL, same read, ${o.clients} clients`,
      check: { ratioAtLeast: 0.8 },
      note: failed > 0 ? `${lite.t.failures} PGlite and ${pg.t.failures} PostgreSQL calls failed` : undefined,
    }),
    figure({
      id: 'h_pglite_vs_postgres_added_p50',
      unit: 'ms',
      value: failure ? Number.NaN : lite.added,
      baseline: pg.added,
      baseline_label:
        'countersign on PostgreSQL: added p50 (ms) over the direct read, one client, sequential',
      ratio: lite.added / pg.added,
      check: { ratioAtMost: 1.2 },
    }),
    figure({
      id: 'h_pglite_cpu_ms_per_call',
      unit: 'ms',
      value: lite.t.cpuMsPerCall,
      baseline: pg.t.cpuMsPerCall,
      baseline_label: `countersign on PostgreSQL, its process tree without the database server, at ${o.clients} clients`,
      check: null,
    }),
    figure({
      id: 'h_pglite_tree_peak_rss_mb',
      unit: 'MB',
      value: lite.rss.mb,
      baseline_label: `countersign on PGlite: its process tree (${lite.rss.processes} processes), VmHWM summed`,
      check: { valueAtMost: 200 },
    }),
  ];
}
