import { execFileSync, spawn } from 'node:child_process';
import path from 'node:path';
import { checkpointDeps } from '../../src/audit/context.ts';
import { createCheckpoint } from '../../src/audit/checkpoints.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { lazyHostRoots } from '../../src/db/host-roots.ts';
import { loadConfig } from '../../src/config.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';
import { generateAuditRows } from '../lib/audit-rows.ts';
import { statusMb } from '../lib/proc.ts';
import { median } from '../lib/stats.ts';
import { figure, type Figure } from '../lib/report.ts';
import { buildOnce, ROOT } from '../lib/server.ts';

export interface ExportOptions {
  url: string;
  /** Scratch directory: data dir (signing key) and the files written. */
  dir: string;
  rows: number;
  log(line: string): void;
}

/** COPY and export jobs of (c), alternated: the figure takes each side's median. */
const PAIRS = 3;

interface Job {
  seconds: number;
  rows: number;
  bytes?: number;
  ok?: boolean;
  valid?: number;
  max_rss_mb: number;
}

/** Runs one bench/audit-worker.ts job in a child process and returns what it measured. */
function job(...args: string[]): Promise<Job> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'bench/audit-worker.ts'), ...args],
      {
        cwd: ROOT,
        env: { PATH: process.env.PATH ?? '', LOG_LEVEL: 'silent' },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    child.on('error', reject);
    child.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`audit worker ${args[0]} exited ${code}: ${err.slice(-2000)}`));
      resolve(JSON.parse(out.trim().split('\n').at(-1)!) as Job);
    });
  });
}

/**
 * `countersign audit export` itself, as an operator runs it (bin/countersign.js, which runs the build
 * while it is fresh: buildOnce makes it so): its wall time and peak RSS (VmHWM, polled).
 */
async function cliExport(
  url: string,
  dataDir: string,
  file: string,
): Promise<{ seconds: number; peak_mb: number }> {
  await buildOnce();
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(
      process.execPath,
      [path.join(ROOT, 'bin/countersign.js'), 'audit', 'export', '--format', 'jsonl', '-o', file],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          DATABASE_URL: url,
          COUNTERSIGN_DATA_DIR: dataDir,
          LOG_LEVEL: 'silent',
        },
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    let peak = 0;
    let err = '';
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    const poll = setInterval(() => (peak = Math.max(peak, statusMb(child.pid!, 'VmHWM') || 0)), 20);
    child.on('error', reject);
    child.on('exit', (code) => {
      clearInterval(poll);
      if (code !== 0)
        return reject(new Error(`countersign audit export exited ${code}: ${err.slice(-2000)}`));
      resolve({ seconds: (performance.now() - t0) / 1000, peak_mb: peak });
    });
  });
}

/**
 * Writes back what earlier steps left in the page cache (`sync`) before a timed job starts, so that no
 * job pays for the writeback of another's files (the export writes 800 MB, the COPY 500 MB, per run
 * of a million rows). Without it, on this project's VMs (ext4, online discard), the export took 4.5 and
 * 4.8 s in two runs, against 3.2-3.7 s in four with it; the COPY 1.8-2.2 s either way.
 */
function settle(): void {
  execFileSync('sync');
}

/**
 * (c) the real export of `rows` audit rows to JSONL against COPY … TO STDOUT of the same rows, with the
 * exporting process's peak RSS; (d) the real offline verifier on that export against one sha256 per
 * row over the same bytes. A checkpoint is signed before the export, as the periodic one would have
 * been, so the export's own checkpoint only covers the rows since.
 */
export async function exportFigures(o: ExportOptions): Promise<Figure[]> {
  const db = await openDatabase({ url: o.url, pgliteDir: '', command: 'bench export' });
  try {
    await migrateLatest(db.knex);
    const t0 = performance.now();
    let reported = 0;
    await generateAuditRows(o.url, o.rows, (done) => {
      if (done - reported >= 200_000) {
        reported = done;
        o.log(`  generated ${done} rows`);
      }
    });
    o.log(`  ${o.rows} chained rows generated in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    // A live table has statistics and is vacuumed (autovacuum analyzes it as it grows, and vacuums an
    // append-only table after each 20% of inserts); one loaded a moment ago is neither yet. Without
    // statistics the planner sorts every row for `order by seq`, for the COPY baseline and the export
    // alike, instead of reading them in key order; unvacuumed, the first reader of each page writes its
    // hint bits, and autovacuum's own pass over the million rows lands in some runs' measurements and
    // not others'. Done here, so no run depends on when autovacuum gets there.
    await db.knex.raw('vacuum (analyze) audit_events');
    const config = loadConfig({ DATABASE_URL: o.url, COUNTERSIGN_DATA_DIR: o.dir }, o.dir);
    const t1 = performance.now();
    const checkpoint = await createCheckpoint(
      await checkpointDeps(
        db.knex,
        createAuditLog(db.knex, { roots: lazyHostRoots(db.knex, config.secrets.host_roots_path) }),
        config,
      ),
    );
    o.log(
      `  periodic checkpoint at seq ${checkpoint?.seq} in ${((performance.now() - t1) / 1000).toFixed(1)} s`,
    );
    // The database's own checkpoint now, not spread over the measurements: loading a million rows asks
    // for one, which otherwise writes the table out over minutes while COPY and export read it.
    await db.knex.raw('checkpoint');
  } finally {
    await db.close();
  }

  const file = path.join(o.dir, 'audit.jsonl');
  const copyFile = path.join(o.dir, 'audit.copy');
  const maxSeq = String(o.rows + 1); // the generated rows and the checkpoint's own row
  // COPY and export alternated, three of each: each figure is a median, so that one job slowed by
  // the machine (a neighbour, a flush) decides neither side.
  const copies: Job[] = [];
  const exports: Job[] = [];
  for (let i = 0; i < PAIRS; i++) {
    settle();
    copies.push(await job('copy', o.url, copyFile, maxSeq));
    o.log(`  COPY: ${copies.at(-1)!.seconds.toFixed(2)} s`);
    settle();
    exports.push(await job('export', o.url, o.dir, file));
    const exp = exports.at(-1)!;
    o.log(
      `  export: ${exp.seconds.toFixed(2)} s for ${exp.rows} rows, peak RSS ${exp.max_rss_mb.toFixed(0)} MB`,
    );
  }
  settle();
  const cli = await cliExport(o.url, o.dir, path.join(o.dir, 'cli.jsonl'));
  o.log(
    `  countersign audit export: ${cli.seconds.toFixed(2)} s from start to exit, peak RSS ${cli.peak_mb.toFixed(0)} MB`,
  );

  const hashes: Job[] = [];
  settle();
  hashes.push(await job('hash', file));
  o.log(`  sha256 per line: ${hashes[0]!.seconds.toFixed(2)} s`);
  settle();
  const ver = await job('verify', file);
  o.log(`  verify: ${ver.seconds.toFixed(2)} s, ${ver.valid}/${ver.rows} valid`);
  settle();
  hashes.push(await job('hash', file));
  o.log(`  sha256 per line: ${hashes[1]!.seconds.toFixed(2)} s`);

  const rate = (jobs: Job[], rows: number) => rows / (jobs.reduce((s, j) => s + j.seconds, 0) / jobs.length);
  // Each export also exports the rows the exports before it appended (a checkpoint and export.created).
  const exportRate = median(exports.map((j) => j.rows / j.seconds));
  const copyRate = median(copies.map((j) => j.rows / j.seconds));
  const last = exports.at(-1)!;
  return [
    figure({
      id: 'c_export',
      unit: 'rows/s',
      value: exportRate,
      baseline: copyRate,
      baseline_label: 'COPY (same rows, seq order) TO STDOUT into a file',
      check: { ratioAtLeast: 0.5 },
      note: `median of ${PAIRS} exports and ${PAIRS} COPYs, alternated; ${last.rows} rows, ${((last.bytes ?? 0) / 2 ** 20).toFixed(0)} MB of JSONL`,
    }),
    figure({
      id: 'c_export_rss_mb',
      unit: 'MB',
      value: cli.peak_mb,
      baseline: copies[0]!.max_rss_mb,
      baseline_label: 'peak RSS of the COPY process',
      check: { valueAtMost: 150 },
      note: `the countersign audit export process (${cli.seconds.toFixed(1)} s from start to exit); the timed export jobs peaked at ${Math.max(...exports.map((j) => j.max_rss_mb)).toFixed(0)} MB`,
    }),
    figure({
      id: 'd_verify',
      unit: 'rows/s',
      value: ver.ok ? ver.rows / ver.seconds : Number.NaN,
      baseline: rate(hashes, ver.rows),
      baseline_label: 'one sha256 per line of the same file',
      check: { ratioAtLeast: 0.5 },
      note: ver.ok ? undefined : `verify failed: ${ver.valid}/${ver.rows} valid`,
    }),
  ];
}
