/**
 * npm run bench [-- --quick] [--only a,b,c,d,e,f,g,h,i,j] [--clients 16] [--seconds 30] [--writers 8] …
 *
 * Measures every figure of docs/performance.md beside its baseline in the same run, prints a table and writes
 * bench/results/latest.json. Runs on PostgreSQL (BENCH_DATABASE_URL, default the local server): each
 * figure gets a fresh database, created here and dropped at the end.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { appendFigures } from './figures/appends.ts';
import { approvalFigures } from './figures/approval.ts';
import { exportFigures } from './figures/export.ts';
import { gatewayFigures } from './figures/gateway.ts';
import { idleFigures } from './figures/idle.ts';
import { readFigures } from './figures/read.ts';
import { waitFigures } from './figures/waits.ts';
import { warmStartFigures } from './figures/warm-start.ts';
import { createScratchDatabase, DEFAULT_ADMIN_URL, postgresVersion, seedDatabase } from './lib/database.ts';
import { machine } from './lib/proc.ts';
import { table, writeResults, type Figure } from './lib/report.ts';
import { ROOT } from './lib/server.ts';

const { values: flags } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    clients: { type: 'string' },
    seconds: { type: 'string' },
    writers: { type: 'string' },
    'append-seconds': { type: 'string' },
    rows: { type: 'string' },
    approvals: { type: 'string' },
    starts: { type: 'string' },
    'gateway-seconds': { type: 'string' },
    'idle-seconds': { type: 'string' },
    'wait-calls': { type: 'string' },
    out: { type: 'string' },
    strict: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});

if (flags.help) {
  process.stdout.write(`npm run bench -- [options]
  --quick               small scale: the whole run finishes in a few minutes
  --only a,b,c,e,f,h,i,j  figures to run (d runs with c, g with a)
  --clients N           concurrent MCP clients for (a) (16)
  --seconds S           measured seconds of read load per server for (a) (30; quick 6)
  --writers N           concurrent audit writers for (b) (8)
  --append-seconds S    measured seconds per variant for (b) (10; quick 3)
  --rows N              audit rows exported and verified for (c)/(d) (1000000; quick 100000)
  --approvals N         dry-run → approve → execute rounds for (e) (200; quick 40)
  --starts N            warm starts for (f) (5; quick 2)
  --gateway-seconds S   measured seconds of load per gateway for (h), with --clients clients (30; quick 6)
  --idle-seconds S      measured seconds without calls per server for (i) (20; quick 10)
  --wait-calls N        sequential calls per step for (j), where one call waits (500; quick 200)
  --out FILE            results file (bench/results/latest.json)
  --strict              exit 1 when a target is missed
  BENCH_SERVER_NODE_ARGS  node options for the countersign servers, e.g. "--cpu-prof --cpu-prof-dir=/tmp/p"
  BENCH_DATABASE_URL    a PostgreSQL server to create scratch databases on (${DEFAULT_ADMIN_URL})
`);
  process.exit(0);
}

const quick = flags.quick!;
const num = (v: string | undefined, full: number, small: number) => (v ? Number(v) : quick ? small : full);
const only = new Set((flags.only ?? 'a,b,c,d,e,f,g,h,i,j').split(',').map((s) => s.trim()));
const adminUrl = process.env.BENCH_DATABASE_URL || DEFAULT_ADMIN_URL;
const log = (line: string) => process.stderr.write(`${line}\n`);
const started = performance.now();

const figures: Figure[] = [];
const timings: Record<string, number> = {};
/**
 * Each section starts after a `sync`: what an earlier section left in the page cache (the export's
 * 800 MB file, the dropped million-row database) is written back before, not while, the next one is
 * measured. Right after (c) and (d) without it, (e)'s one plain INSERT took 0.64 ms (p50) against 0.36
 * when (e) ran alone, and its cycle 44.6 ms against 31.7.
 */
async function section(key: string, title: string, run: () => Promise<Figure[]>) {
  if (!only.has(key)) return;
  execFileSync('sync');
  log(`(${key}) ${title}`);
  const t0 = performance.now();
  figures.push(...(await run()));
  timings[key] = Math.round((performance.now() - t0) / 100) / 10;
}

/** A scratch database with the demo directory, an agent and a chair; dropped afterwards. */
async function withSeeded<T>(
  label: string,
  run: (url: string, dataDir: string, token: string, chair: { name: string; password: string }) => Promise<T>,
) {
  const db = await createScratchDatabase(adminUrl, label);
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), `countersign-bench-${label}-`));
  try {
    const seeded = await seedDatabase(db.url, dataDir);
    return await run(db.url, dataDir, seeded.token, seeded.chair);
  } finally {
    await db.drop();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

await section('a', 'audited reads over Streamable HTTP vs a bare MCP SDK server', () =>
  withSeeded('read', (url, dataDir, token) =>
    readFigures({
      url,
      dataDir,
      token,
      clients: num(flags.clients, 16, 16),
      seconds: num(flags.seconds, 30, 6),
      segments: quick ? 2 : 4,
      log,
    }),
  ),
);

await section('b', 'audit appends vs raw INSERTs and one-row-per-lock chaining', async () => {
  const db = await createScratchDatabase(adminUrl, 'append');
  try {
    return await appendFigures({
      url: db.url,
      writers: num(flags.writers, 8, 8),
      seconds: num(flags['append-seconds'], 10, 3),
      log,
    });
  } finally {
    await db.drop();
  }
});

if (only.has('d') && !only.has('c')) only.add('c');
await section('c', 'export and verify of audit rows vs COPY and one sha256 per row', async () => {
  const db = await createScratchDatabase(adminUrl, 'export');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-bench-export-'));
  try {
    return await exportFigures({ url: db.url, dir, rows: num(flags.rows, 1_000_000, 100_000), log });
  } finally {
    await db.drop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

await section('e', 'dry-run → approve → execute', () =>
  withSeeded('approval', (url, dataDir, token, chair) =>
    approvalFigures({ url, dataDir, token, chair, rounds: num(flags.approvals, 200, 40), log }),
  ),
);

await section('f', 'warm start to the first served call on PGlite', () =>
  warmStartFigures({ starts: num(flags.starts, 5, 2), log }),
);

await section('h', 'countersign vs supergateway and mcp-proxy, proxying a 1 KiB read_text_file', () =>
  withSeeded('gateway', async (url, dataDir, token) => {
    const pgliteDir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-bench-gateway-pglite-'));
    try {
      return await gatewayFigures({
        url,
        dataDir,
        token,
        clients: num(flags.clients, 16, 16),
        seconds: num(flags['gateway-seconds'], 30, 6),
        // Short segments, many of them: the machine's drift lands on both gateways alike.
        segments: quick ? 4 : 10,
        sequentialCalls: quick ? 200 : 800,
        pgliteDir,
        log,
      });
    } finally {
      fs.rmSync(pgliteDir, { recursive: true, force: true });
    }
  }),
);

await section('i', 'idle: CPU a second with no calls, PostgreSQL and PGlite', () =>
  withSeeded('idle', async (url, dataDir, token) => {
    const pgliteDir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-bench-idle-pglite-'));
    try {
      return await idleFigures({
        url,
        dataDir,
        token,
        pgliteDir,
        seconds: num(flags['idle-seconds'], 20, 10),
        log,
      });
    } finally {
      fs.rmSync(pgliteDir, { recursive: true, force: true });
    }
  }),
);

await section('j', 'where one sequential call waits: database, commit, upstream, event loop', () =>
  withSeeded('waits', (url, dataDir, token, chair) =>
    waitFigures({ url, dataDir, token, chair, calls: num(flags['wait-calls'], 500, 200), log }),
  ),
);

const results = {
  generated_at: new Date().toISOString(),
  mode: quick ? 'quick' : 'full',
  wall_seconds: Math.round((performance.now() - started) / 100) / 10,
  section_seconds: timings,
  figures,
  machine: machine(await postgresVersion(adminUrl)),
};
const out = flags.out ?? path.join(ROOT, 'bench/results/latest.json');
writeResults(out, results);
process.stdout.write(
  `${table(figures)}\n\nwall time ${results.wall_seconds} s; results in ${path.relative(process.cwd(), out)}\n`,
);
if (flags.strict && figures.some((f) => f.met === false)) process.exitCode = 1;
