/**
 * npm run drill [-- kill|cut|soak|chaos|abuse …] [--quick] [--seconds S] [--soak-minutes M] …
 *
 * Reliability drills against real server processes on a scratch PostgreSQL database (created on
 * BENCH_DATABASE_URL's server and dropped afterwards). Each ends with the invariant check of
 * invariants.ts and writes bench/results/drill-<name>.json. Exit code 1 when an invariant failed.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { openDatabase } from '../../src/db/knex.ts';
import { createScratchDatabase, DEFAULT_ADMIN_URL, seedDatabase } from '../lib/database.ts';
import { fsUpstream } from '../lib/fs-upstream.ts';
import { statusMb, treeStatusMb } from '../lib/proc.ts';
import { writeResults } from '../lib/report.ts';
import { callTool, connect, ROOT } from '../lib/server.ts';
import { sleep } from '../lib/stats.ts';
import { startBalancer, type Balancer } from './balancer.ts';
import { startCluster, type Cluster } from './cluster.ts';
import { abuseDrill } from './abuse.ts';
import { checkInvariants, phantomWrites, type InvariantReport } from './invariants.ts';
import { startPgCluster } from './pg-cluster.ts';
import { startProxy } from './proxy.ts';
import { startWorkload, type Workload } from './workload.ts';

const { values: flags, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    quick: { type: 'boolean', default: false },
    seconds: { type: 'string' },
    'kill-every': { type: 'string' },
    'cut-seconds': { type: 'string' },
    'soak-minutes': { type: 'string' },
    rate: { type: 'string' },
    flood: { type: 'string' },
    sustain: { type: 'string' },
    only: { type: 'string' },
    repeat: { type: 'string' },
    'proxy-rate': { type: 'string' },
    'no-pin': { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  process.stdout
    .write(`npm run drill -- [kill] [cut] [soak] [chaos] [abuse] [options]   (kill, cut and soak by default)
  --quick             short versions: kill 20 s, cut 6 s of outage, soak 1 minute, chaos 30 s, abuse 600 bad tokens
  --seconds S         kill: how long servers are killed and restarted (60); cut: load before and after the cut (15);
                      chaos: how long faults go on (60; the whole cycle of faults runs at least once)
  --kill-every S      kill: seconds between two SIGKILLs (4); chaos: between two faults (4)
  --flood N           abuse: bad bearer tokens sent (2000); the other floods a share of it
  --sustain S         abuse: each flood goes on for S seconds at least, however many that sends (0: the counts only)
  --only A,B          abuse: only the attacks whose names contain A or B (working on one; the verdict is the whole drill's)
  --repeat N          abuse: each attack N times, each after a quiet window of its own (1)
  --no-pin            abuse: leave the server and the attackers unpinned (by default, with taskset and 2+ CPUs,
                      the server gets one CPU and the drill and the hostile upstream the others)
  --cut-seconds S     cut: how long the database stays unreachable (10)
  --soak-minutes M    soak: duration (10)
  --rate N            soak: built-in read calls per second (40; 0: none)
  --proxy-rate N      soak: proxied upstream calls per second (fs__read_text_file, 40; 0: none)
`);
  process.exit(0);
}
const quick = flags.quick!;
const num = (v: string | undefined, full: number, small: number) => (v ? Number(v) : quick ? small : full);
const drills = positionals.length > 0 ? positionals : ['kill', 'cut', 'soak'];
const adminUrl = process.env.BENCH_DATABASE_URL || DEFAULT_ADMIN_URL;
const log = (line: string) => process.stderr.write(`${line}\n`);

/** Settings that make interrupted executions reconcile within a drill, and checkpoints happen. */
const SERVER_ENV = {
  COUNTERSIGN_CALL_TIMEOUT_MS: '3000',
  COUNTERSIGN_MAINTENANCE_INTERVAL_S: '1',
  COUNTERSIGN_CHECKPOINT_INTERVAL_S: '5',
};
const SETTLE_MS = 20_000;

async function scratch(label: string, on = adminUrl) {
  const db = await createScratchDatabase(on, label);
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), `countersign-drill-${label}-`));
  const seeded = await seedDatabase(db.url, dataDir, 200);
  return {
    ...db,
    dataDir,
    ...seeded,
    async dispose() {
      await db.drop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** How often the kill drill's balancer re-reads which replicas are up (its health check). */
const HEALTH_CHECK_MS = 1000;

/** Requests by the protocol revision of their client, and what the balancer saw (when there is one). */
function traffic(load: Workload, balancer?: Balancer) {
  const byRevision = Object.fromEntries(
    Object.entries(load.byRevision).map(([rev, t]) => [rev, { requests: t.total, ...t.counts }]),
  );
  const writes: Record<string, Record<string, number>> = {};
  for (const w of load.writes) {
    const byStatus = (writes[w.revision] ??= {});
    byStatus[w.status] = (byStatus[w.status] ?? 0) + 1;
  }
  log(`  by protocol revision: ${JSON.stringify(byRevision)}; writes ${JSON.stringify(writes)}`);
  // Writes whose execution was sent more than once: what each request got, and how the write settled.
  const again = load.writes
    .filter((w) => w.execute_attempts > w.first_round)
    .map((w) => ({ revision: w.revision, executions: w.executions, status: w.status }));
  if (again.length) log(`  executions sent again: ${JSON.stringify(again)}`);
  const seen = { by_revision: byRevision, writes_by_revision: writes, executed_again: again };
  if (!balancer) return seen;
  const { per_replica, ...stats } = balancer.stats;
  log(`  balancer: ${JSON.stringify(stats)} over ${Object.keys(per_replica).length} replica addresses`);
  return { ...seen, balancer: balancer.stats };
}

function summarise(name: string, report: InvariantReport, extra: Record<string, unknown>) {
  log(
    `  writes: ${JSON.stringify(report.writes)}; executions sent again: ${report.retried}; settled by reconciliation: ${report.reconciled}`,
  );
  for (const c of report.checks) log(`  ${c.ok ? 'ok  ' : 'FAIL'} ${c.name}: ${c.detail}`);
  writeResults(path.join(ROOT, `bench/results/drill-${name}.json`), {
    drill: name,
    generated_at: new Date().toISOString(),
    command: `npm run drill -- ${process.argv.slice(2).join(' ')}`.trim(),
    ...extra,
    invariants: report,
  });
  return report.ok;
}

/** (i) three servers under reads and writes; a random one SIGKILLed every few seconds and restarted. */
async function killDrill(): Promise<boolean> {
  const seconds = num(flags.seconds, 60, 20);
  const every = num(flags['kill-every'], 4, 3);
  log(`kill: 3 servers, ${seconds} s, SIGKILL every ${every} s`);
  const db = await scratch('kill');
  const cluster = await startCluster(3, {
    DATABASE_URL: db.url,
    COUNTERSIGN_DATA_DIR: db.dataDir,
    ...SERVER_ENV,
  });
  // Every client, and the chair, goes through a round-robin balancer whose health check lags a kill.
  const balancer = await startBalancer(() => cluster.live(), { healthCheckMs: HEALTH_CHECK_MS });
  try {
    const load = startWorkload({
      url: balancer.url,
      token: db.token,
      chair: db.chair,
      readers: 6,
      writers: 3,
      paceMs: 50,
    });
    const kills: number[] = [];
    for (const end = Date.now() + seconds * 1000; Date.now() < end;) {
      await sleep(every * 1000);
      const slot = Math.floor(Math.random() * 3);
      await cluster.kill(slot);
      kills.push(slot);
      await sleep(500);
      await cluster.restart(slot);
    }
    await load.stop();
    await cluster.heal();
    const report = await checkInvariants(db.url, {
      tally: load.tally,
      writes: load.writes,
      settleMs: SETTLE_MS,
      // A killed server answers nothing, and a request it held may wait out the client's timeout.
      allowed: ['lost', 'timeout'],
    });
    log(
      `  ${kills.length} SIGKILLs; ${load.tally.total} requests: ${JSON.stringify(load.tally.counts)}; codes ${JSON.stringify(load.tally.codes)}`,
    );
    const seen = traffic(load, balancer);
    return summarise('kill', report, {
      seconds,
      kill_every_s: every,
      health_check_ms: HEALTH_CHECK_MS,
      kills: kills.length,
      requests: load.tally,
      ...seen,
    });
  } finally {
    await balancer.close();
    await cluster.stop();
    await db.dispose();
  }
}

/** Every server answers a read again; resolves with the time that took. */
async function recovered(cluster: Cluster, token: string, timeoutMs: number): Promise<number | null> {
  const t0 = Date.now();
  const pending = new Set(cluster.live());
  while (pending.size > 0 && Date.now() - t0 < timeoutMs) {
    for (const url of [...pending]) {
      try {
        const client = await connect(url, token);
        const { envelope } = await callTool(client, 'isphere_search_contacts', { query: 'alice' }, 10_000);
        await client.close();
        if (envelope.ok === true) pending.delete(url);
      } catch {
        // not yet
      }
    }
    if (pending.size > 0) await sleep(250);
  }
  return pending.size === 0 ? Date.now() - t0 : null;
}

/** (ii) the database connection cut through a TCP proxy mid-load, then restored; no server restarted. */
async function cutDrill(): Promise<boolean> {
  const around = num(flags.seconds, 15, 6);
  const cutSeconds = num(flags['cut-seconds'], 10, 6);
  log(
    `cut: 2 servers behind a TCP proxy to PostgreSQL; ${around} s of load, ${cutSeconds} s cut, ${around} s more`,
  );
  const db = await scratch('cut');
  const direct = new URL(db.url);
  const proxy = await startProxy({ host: direct.hostname, port: Number(direct.port || 5432) });
  const viaProxy = new URL(db.url);
  viaProxy.port = String(proxy.port);
  const cluster = await startCluster(2, {
    DATABASE_URL: viaProxy.href,
    COUNTERSIGN_DATA_DIR: db.dataDir,
    ...SERVER_ENV,
  });
  const pids = cluster.children().map((c) => c!.pid);
  const balancer = await startBalancer(() => cluster.live());
  try {
    const load = startWorkload({
      url: balancer.url,
      token: db.token,
      chair: db.chair,
      readers: 4,
      writers: 2,
      paceMs: 50,
    });
    await sleep(around * 1000);
    const before = { ...load.tally.counts };
    proxy.cut();
    log('  cut');
    await sleep(cutSeconds * 1000);
    const during = Object.fromEntries(
      Object.entries(load.tally.counts).map(([k, v]) => [k, v - before[k as keyof typeof before]]),
    );
    const codesDuring = { ...load.tally.codes };
    proxy.restore();
    log('  restored');
    const recoveryMs = await recovered(cluster, db.token, 60_000);
    log(
      `  every server answered again ${recoveryMs === null ? 'NEVER (60 s)' : `after ${(recoveryMs / 1000).toFixed(2)} s`}`,
    );
    await sleep(around * 1000);
    await load.stop();
    const sameProcesses = cluster
      .children()
      .every((c, i) => c && c.pid === pids[i] && c.child.exitCode === null);
    const report = await checkInvariants(db.url, {
      tally: load.tally,
      writes: load.writes,
      settleMs: SETTLE_MS,
      allowed: [],
    });
    report.checks.push({
      name: 'recovered without a restart',
      ok: sameProcesses && recoveryMs !== null,
      detail: `same processes: ${sameProcesses}; recovery ${recoveryMs} ms`,
    });
    report.ok &&= sameProcesses && recoveryMs !== null;
    log(`  during the cut: ${JSON.stringify(during)}; codes so far ${JSON.stringify(codesDuring)}`);
    const seen = traffic(load, balancer);
    return summarise('cut', report, {
      cut_seconds: cutSeconds,
      load_seconds_each_side: around,
      during_cut: during,
      recovery_ms: recoveryMs,
      requests: load.tally,
      ...seen,
    });
  } finally {
    await balancer.close();
    await cluster.stop();
    await proxy.close();
    await db.dispose();
  }
}

/** RSS samples of the soak's server: its own (the check) and its process tree's (the upstream child too). */
interface Sample {
  t_s: number;
  rss_mb: number;
  tree_rss_mb: number;
}

/** After the warm-up, RSS grows at most this much per minute (least-squares slope of the server's VmRSS). */
const FLAT_MB_PER_MIN = 1;
/** The warm-up left out of the flatness check: 2 minutes, or the first half of a shorter run. */
const warmupSeconds = (minutes: number) => Math.min(120, (minutes * 60) / 2);

/** The least-squares slope of `rss_mb` over the samples from `fromS` on, in MB per minute. */
function slopeMbPerMin(samples: Sample[], fromS: number): number {
  const after = samples.filter((p) => p.t_s >= fromS);
  const mt = after.reduce((s, p) => s + p.t_s, 0) / after.length;
  const mr = after.reduce((s, p) => s + p.rss_mb, 0) / after.length;
  const cov = after.reduce((s, p) => s + (p.t_s - mt) * (p.rss_mb - mr), 0);
  const varT = after.reduce((s, p) => s + (p.t_s - mt) ** 2, 0);
  return after.length < 3 ? Number.NaN : (cov / varT) * 60;
}

/**
 * Audit rows of the proxied tool: every call answered with an envelope (ok or refused: the pipeline's
 * answers) must have its row — nothing unaudited on that path.
 */
async function proxiedAudited(url: string, tool: string, answered: number) {
  const db = await openDatabase({ url, pgliteDir: '', command: 'drill check' });
  try {
    const row = (await db
      .knex('audit_events')
      .where({ kind: 'tool.call', tool })
      .count({ n: '*' })
      .first()) as {
      n: unknown;
    };
    const rows = Number(row.n);
    return {
      name: `every proxied call audited (${tool})`,
      ok: rows >= answered,
      detail: `${rows} audit rows for ${answered} calls answered with an envelope`,
    };
  } finally {
    await db.close();
  }
}

/** The server's log lines about its upstream (at most 50): when it connected, lost it, and why. */
const upstreamLog = (logs: string) =>
  logs
    .split('\n')
    .filter((line) => line.includes('"upstream":'))
    .slice(0, 50);

/** Samples RSS every 5 s for `minutes`, logging every half minute. */
async function sampleRss(pid: number, minutes: number, load: Workload): Promise<Sample[]> {
  const samples: Sample[] = [];
  const t0 = Date.now();
  for (const end = t0 + minutes * 60_000; Date.now() < end;) {
    await sleep(Math.min(5000, end - Date.now()));
    const mb = (v: number) => Math.round(v * 10) / 10;
    samples.push({
      t_s: Math.round((Date.now() - t0) / 1000),
      rss_mb: mb(statusMb(pid, 'VmRSS')),
      tree_rss_mb: mb(treeStatusMb(pid, 'VmRSS').mb),
    });
    const last = samples.at(-1)!;
    if (samples.length % 6 === 0)
      log(
        `  ${last.t_s} s: RSS ${last.rss_mb} MB (with the upstream ${last.tree_rss_mb} MB), ${load.tally.total} requests`,
      );
  }
  return samples;
}

/** The soak's memory checks: flat after the warm-up, and the peak under the 200 MB of docs/performance.md. */
function memoryChecks(pid: number, minutes: number, samples: Sample[]) {
  const peak = statusMb(pid, 'VmHWM');
  const warmup = warmupSeconds(minutes);
  const slope = slopeMbPerMin(samples, warmup);
  const after = samples.filter((p) => p.t_s >= warmup).map((p) => p.rss_mb);
  const rss = {
    first_mb: samples[0]?.rss_mb,
    last_mb: samples.at(-1)?.rss_mb,
    max_mb: Math.max(...samples.map((p) => p.rss_mb)),
    peak_hwm_mb: Math.round(peak),
    warmup_s: warmup,
    after_warmup_min_mb: Math.min(...after),
    after_warmup_max_mb: Math.max(...after),
    slope_mb_per_min: Math.round(slope * 100) / 100,
    tree_last_mb: samples.at(-1)?.tree_rss_mb,
  };
  const checks = [
    {
      name: `RSS flat after a ${warmup} s warm-up (least-squares slope at most ${FLAT_MB_PER_MIN} MB a minute)`,
      ok: slope <= FLAT_MB_PER_MIN,
      detail: JSON.stringify(rss),
    },
    { name: 'peak RSS at most 200 MB', ok: peak <= 200, detail: `VmHWM ${Math.round(peak)} MB` },
  ];
  return { rss, checks };
}

/**
 * (iii) one server at a fixed rate for minutes, its RSS sampled: built-in reads, proxied reads of an
 * upstream filesystem server's 1 KiB file, and a steady trickle of writes.
 */
async function soakDrill(): Promise<boolean> {
  const minutes = num(flags['soak-minutes'], 10, 1);
  const rate = num(flags.rate, 40, 40);
  const proxyRate = num(flags['proxy-rate'], 40, 40);
  log(
    `soak: 1 server, ${rate} reads/s, ${proxyRate} proxied reads/s and one writer (a write, then 1 s pause), ${minutes} min`,
  );
  const db = await scratch('soak');
  const upstream = fsUpstream('drill-soak-fs');
  const tool = `${upstream.name}__read_text_file`;
  const cluster = await startCluster(1, {
    DATABASE_URL: db.url,
    COUNTERSIGN_DATA_DIR: db.dataDir,
    COUNTERSIGN_CONFIG: upstream.config,
    ...SERVER_ENV,
  });
  const pid = cluster.children()[0]!.pid;
  try {
    const readers = 8;
    // One server: the clients talk to it directly (a balancer would add a hop and nothing else).
    const load = startWorkload({
      url: cluster.live()[0]!,
      token: db.token,
      chair: db.chair,
      // A rate of 0 leaves that path out: the other one alone tells which path keeps memory.
      readers: rate > 0 ? readers : 0,
      writers: 1,
      paceMs: (readers * 1000) / rate,
      writerPauseMs: 1000,
      proxied:
        proxyRate > 0
          ? { readers, paceMs: (readers * 1000) / proxyRate, tool, args: { path: upstream.file } }
          : undefined,
    });
    const samples = await sampleRss(pid, minutes, load);
    await load.stop();
    const report = await checkInvariants(db.url, {
      tally: load.tally,
      writes: load.writes,
      settleMs: SETTLE_MS,
      allowed: [],
    });
    const { rss, checks } = memoryChecks(pid, minutes, samples);
    const proxied = load.byPath.proxied;
    report.checks.push(
      ...checks,
      await proxiedAudited(db.url, tool, proxied.counts.ok + proxied.counts.refused),
    );
    report.ok = report.checks.every((c) => c.ok);
    const calls = load.tally.total;
    log(
      `  ${calls} requests (${(calls / (minutes * 60)).toFixed(1)}/s): ${JSON.stringify(load.tally.counts)}`,
    );
    const byPath = Object.fromEntries(
      Object.entries(load.byPath).map(([k, t]) => [k, { requests: t.total, ...t.counts }]),
    );
    log(`  by path: ${JSON.stringify(byPath)}`);
    const seen = traffic(load);
    return summarise('soak', report, {
      minutes,
      rate,
      proxy_rate: proxyRate,
      rss,
      samples,
      requests: load.tally,
      by_path: byPath,
      // The server's own word on its upstream (connected, disconnected and why), for a SOURCE_UNAVAILABLE.
      upstream_log: upstreamLog(cluster.logs()),
      ...seen,
    });
  } finally {
    await cluster.stop();
    await db.dispose();
    upstream.dispose();
  }
}

/** Runs the built CLI against a drill's database; resolves with its exit code and output. */
function cli(args: string[], env: Record<string, string>): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [path.join(ROOT, 'dist/cli.js'), ...args],
      { cwd: ROOT, env: { PATH: process.env.PATH ?? '', ...env }, timeout: 120_000 },
      (err, stdout, stderr) =>
        resolve({
          code: err ? Number((err as { code?: unknown }).code ?? 1) || 1 : 0,
          out: `${stdout}${stderr}`.trim(),
        }),
    );
  });
}

/** Both export formats written and verified offline by the CLI, as compliance would. */
async function exportsVerify(env: Record<string, string>, dir: string) {
  const checks: InvariantReport['checks'] = [];
  // Verified against the server's key as compliance pins it, not the key a manifest names.
  const key = await cli(['audit', 'key'], env);
  const keyFile = path.join(dir, 'drill-audit-key.pem');
  fs.writeFileSync(keyFile, `${key.out}\n`);
  for (const format of ['jsonl', 'csv']) {
    const file = path.join(dir, `drill-export.${format}`);
    const exported = await cli(['audit', 'export', '-o', file, '--force'], env);
    const verified =
      exported.code === 0 ? await cli(['audit', 'verify', file, '--pubkey', keyFile], env) : exported;
    checks.push({
      name: `the ${format} export verifies offline`,
      ok: exported.code === 0 && verified.code === 0,
      detail: verified.out.split('\n').slice(0, 3).join('; '),
    });
  }
  return checks;
}

interface Fault {
  at_s: number;
  fault: 'sigkill' | 'sigstop' | 'pg_restart_immediate' | 'pg_stop';
  detail: string;
  /** How long the fault lasted (a stopped process or database), in seconds. */
  lasted_s: number;
}

/**
 * (iv) chaos: three servers behind the round-robin balancer on a PostgreSQL cluster of the drill's
 * own, under reads and writes from clients of both protocol revisions, a third of the executions
 * raced by five clients at once; meanwhile, in turn: SIGKILLs of a server (restarted), a SIGSTOP of
 * one (continued after up to 15 s), an immediate restart of PostgreSQL, and a stop of it (up to 13 s).
 * Then, every fault cleared: the invariants, once more the approvals that failed (no late write may
 * land on one), and both exports verified offline.
 */
async function chaosDrill(): Promise<boolean> {
  const seconds = num(flags.seconds, 60, 30);
  const every = num(flags['kill-every'], 4, 3);
  const pauseS = Math.min(15, Math.max(4, Math.round(seconds / 4)));
  const pgStopS = Math.min(13, Math.max(4, Math.round(seconds / 5)));
  log(
    `chaos: 3 servers behind a balancer on a PostgreSQL of its own, ${seconds} s; a fault every ${every} s ` +
      `(SIGKILL, SIGSTOP for ${pauseS} s, PostgreSQL immediate restart, PostgreSQL stopped for ${pgStopS} s)`,
  );
  const pgc = await startPgCluster('chaos');
  let db: Awaited<ReturnType<typeof scratch>> | undefined;
  let cluster: Cluster | undefined;
  let balancer: Balancer | undefined;
  try {
    db = await scratch('chaos', pgc.adminUrl);
    const env = { DATABASE_URL: db.url, COUNTERSIGN_DATA_DIR: db.dataDir };
    cluster = await startCluster(3, { ...env, ...SERVER_ENV });
    const servers = cluster;
    balancer = await startBalancer(() => servers.live(), { healthCheckMs: HEALTH_CHECK_MS });
    const load = startWorkload({
      url: balancer.url,
      token: db.token,
      chair: db.chair,
      readers: 6,
      writers: 3,
      paceMs: 50,
      race: { every: 3, racers: 5 },
      tasks: { askers: 2, paceMs: 250 },
    });
    const t0 = Date.now();
    const faults: Fault[] = [];
    const cycle: Fault['fault'][] = [
      'sigkill',
      'sigstop',
      'sigkill',
      'pg_restart_immediate',
      'sigkill',
      'pg_stop',
    ];
    // The whole cycle at least once, however short the run; then on until the time is up.
    for (let i = 0; i < cycle.length || Date.now() - t0 < seconds * 1000; i++) {
      await sleep(every * 1000);
      const fault = cycle[i % cycle.length]!;
      const at = Date.now();
      const slot = Math.floor(Math.random() * 3);
      let detail = '';
      if (fault === 'sigkill') {
        await servers.kill(slot);
        await sleep(500);
        await servers.restart(slot);
        detail = `server ${slot}, restarted`;
      } else if (fault === 'sigstop') {
        const child = servers.children()[slot]!.child;
        child.kill('SIGSTOP');
        await sleep(pauseS * 1000);
        child.kill('SIGCONT');
        detail = `server ${slot}, left in the balancer's rotation`;
      } else if (fault === 'pg_restart_immediate') {
        await pgc.stopImmediate();
        await pgc.start();
        detail = 'pg_ctl stop -m immediate, then start';
      } else {
        await pgc.stopFast();
        await sleep(pgStopS * 1000);
        await pgc.start();
        detail = 'pg_ctl stop -m fast, then start';
      }
      const lasted = (Date.now() - at) / 1000;
      faults.push({
        at_s: Math.round((at - t0) / 100) / 10,
        fault,
        detail,
        lasted_s: Math.round(lasted * 10) / 10,
      });
      log(`  ${((at - t0) / 1000).toFixed(1)} s: ${fault} (${detail}; ${lasted.toFixed(1)} s)`);
    }
    await load.stop();
    await servers.heal();
    const report = await checkInvariants(db.url, {
      tally: load.tally,
      writes: load.writes,
      settleMs: SETTLE_MS,
      // A killed server answers nothing (the balancer says so); every other request gets its answer in time.
      allowed: ['lost'],
      taskCalls: load.taskCalls,
    });
    // Every fault cleared for a while: a late write on a request settled as not written would show now.
    await sleep(LATE_WRITE_WAIT_MS);
    const late = await phantomWrites(db.url);
    report.checks.push({
      name: `not written stays not written (${LATE_WRITE_WAIT_MS / 1000} s after every fault cleared)`,
      ok: late.phantom.length === 0,
      detail: `${late.failed} failed approvals; ${late.phantom.length} with a message (${late.phantom.slice(0, 3).join(', ')})`,
    });
    report.checks.push(...(await exportsVerify(env, db.dataDir)));
    report.ok = report.checks.every((c) => c.ok);
    log(
      `  ${faults.length} faults; ${load.tally.total} requests: ${JSON.stringify(load.tally.counts)}; codes ${JSON.stringify(load.tally.codes)}`,
    );
    const raced = load.writes.filter((w) => w.raced);
    const seen = traffic(load, balancer);
    return summarise('chaos', report, {
      seconds,
      fault_every_s: every,
      sigstop_s: pauseS,
      pg_stop_s: pgStopS,
      health_check_ms: HEALTH_CHECK_MS,
      faults,
      fault_counts: Object.fromEntries(cycle.map((f) => [f, faults.filter((x) => x.fault === f).length])),
      approvals: load.writes.filter((w) => w.approval_id).length,
      raced_writes: raced.length,
      raced_answers: Object.fromEntries(
        [...new Set(raced.flatMap((w) => w.executions))].map((k) => [
          k,
          raced.flatMap((w) => w.executions).filter((e) => e === k).length,
        ]),
      ),
      requests: load.tally,
      ...seen,
    });
  } finally {
    await balancer?.close();
    await cluster?.stop();
    await db?.dispose();
    await pgc.dispose();
  }
}

/** How long the chaos drill waits, every fault cleared, before it looks for late writes once more. */
const LATE_WRITE_WAIT_MS = 10_000;

/** (v) abuse: the hostile callers and upstreams, one attack after another, against one server (abuse.ts). */
async function abuseDrillRun(): Promise<boolean> {
  const flood = num(flags.flood, 2000, 600);
  log(
    `abuse: one server, one attack after another (${flood} bad tokens first), a well-behaved agent all along`,
  );
  // A PostgreSQL of its own, pinned with the server: the attackers' CPU is not the database's.
  const pgc = await startPgCluster('abuse');
  const db = await scratch('abuse', pgc.adminUrl);
  const env = { DATABASE_URL: db.url, COUNTERSIGN_DATA_DIR: db.dataDir };
  try {
    const { report, extra } = await abuseDrill({
      dbUrl: db.url,
      dataDir: db.dataDir,
      token: db.token,
      env: {},
      flood,
      sustainMs: Number(flags.sustain ?? 0) * 1000,
      only: flags.only?.split(','),
      repeat: Number(flags.repeat ?? 1),
      log,
      cli: (args) => cli(args, env),
      pin: !flags['no-pin'],
      databasePids: () => pgc.pids(),
    });
    return summarise('abuse', report, { flood, sustain_s: Number(flags.sustain ?? 0), ...extra });
  } finally {
    await db.dispose();
    await pgc.dispose();
  }
}

const runs = {
  kill: killDrill,
  cut: cutDrill,
  soak: soakDrill,
  chaos: chaosDrill,
  abuse: abuseDrillRun,
} as const;
let ok = true;
for (const name of drills) {
  const run = runs[name as keyof typeof runs];
  if (!run) throw new Error(`unknown drill ${name}: ${Object.keys(runs).join(', ')}`);
  const t0 = Date.now();
  const passed = await run();
  log(
    `${name}: ${passed ? 'all invariants held' : 'INVARIANTS FAILED'} (${((Date.now() - t0) / 1000).toFixed(0)} s)\n`,
  );
  ok &&= passed;
}
process.exitCode = ok ? 0 : 1;
