import { execFileSync, fork, type ChildProcess } from 'node:child_process';
import { createHmac, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { fetchUnwarned } from '../../src/core/fetch.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { EVENT_LOOP_SAMPLE_MS } from '../../src/server/metrics.ts';
import { seedHostRoots } from '../lib/database.ts';
import { statusMb } from '../lib/proc.ts';
import { callTool, connect, ROOT, spawnCountersign, spawnNode, type Child } from '../lib/server.ts';
import { freePort } from '../lib/gateway-process.ts';
import { percentile, round, sleep } from '../lib/stats.ts';
import type { InvariantReport } from './invariants.ts';

/** An approval rule whose pattern a backtracking engine cannot finish on a long text of word characters. */
const CATASTROPHIC_RULE = {
  name: 'Plain words pass',
  when: 'content.text.matches("^(\\\\w+\\\\s?)*$")',
  then: { allow_without_review: { reason: 'plain words' } },
};

/**
 * The abuse drill (`npm run drill -- abuse`): the hostile callers and upstreams of docs/reliability.md,
 * one attack after another against one server, while a well-behaved agent searches the directory every
 * BYSTANDER_EVERY_MS. Per attack: the requests sent, how they were answered, the audit rows they wrote,
 * the well-behaved agent's p99 during it, and the server's RSS after it. It passes when every attack
 * was refused as designed, the well-behaved p99 during each attack stayed within 3× its quiet p99, and
 * the server never went down.
 *
 * The quiet p99 an attack is judged against is its own: a quiet window of QUIET_MS (and at least
 * QUIET_CALLS calls) just before it, with no attack running; both are printed, with their ratio.
 * Load on a shared machine drifts over minutes, and a baseline taken once at the start is not
 * comparable with an attack several minutes later. The attack's own window is as long and has as
 * many calls at least: the attack, 2 s after it, and on until QUIET_MS and QUIET_CALLS are reached. (A
 * nearest-rank p99 of fewer than 100 calls is the slowest of them: an attack of 0.3 s and 2 s after it
 * had 85 calls, judged by its slowest against the second slowest of a quiet window's 200.) With
 * `--sustain S` each flood goes on for S seconds at least, the harder test: a flood at full speed
 * for the whole window, not a burst of its count.
 *
 * The well-behaved agent runs in a process of its own (this file, forked with the argument
 * `bystander`): in the drill's process its answers would wait behind the attackers' own work (a
 * flood's answers, 100,000-character names), which an attacker elsewhere would not put in its way.
 *
 * Where the machine has two CPUs or more (os.availableParallelism() >= 2) and `taskset` is on the
 * PATH, the server is pinned to the first CPU this drill may use and everything else of the drill to
 * the others, every thread of each process (`taskset -a`): the drill process (it sends the floods),
 * the hostile upstream, the well-behaved agent's process and the CLI. That stands in for an attacker
 * off the server's box: what the attackers spend on their side is not taken from the server's CPU.
 * (The startup window's second server, started from the drill, runs on the drill's CPUs; PostgreSQL
 * runs where the machine puts it.) The drill prints what it pinned; `--no-pin` turns this off; without `taskset`, or with one CPU, nothing
 * is pinned and the drill says so. The hostile upstream runs at nice 19, every thread of it (its
 * collector's helper threads make a 64 MiB answer as much as its main thread does).
 *
 * Beside each p99, where the time went: the agent's slowest call as the server timed it (its
 * countersign_tool_call_seconds histogram), the server's own event-loop delay, how long the agent's
 * own process and the drill's were held (the machine, not the server) — in the quiet window and in
 * the attack.
 */

export interface AttackFigures {
  attack: string;
  requests: number;
  /** How the attack's requests were answered: HTTP status or envelope code, and how many of each. */
  answers: Record<string, number>;
  audit_rows: number;
  seconds: number;
  /** The well-behaved agent's latency while the attack ran, and 2 s after (ms). */
  good_p99_ms: number | null;
  good_calls: number;
  good_failed: number;
  /** The same in the quiet window just before the attack: the baseline this attack is judged against. */
  quiet_p99_ms: number | null;
  quiet_calls: number;
  quiet_failed: number;
  /** good_p99_ms / quiet_p99_ms; within LATENCY_BOUND is the pass. */
  ratio: number | null;
  /**
   * The server's own event-loop delay while the attack ran, and in its quiet window (prom-client's
   * eventloop lag figures, which restart at each scrape of /metrics, less the sampler's period
   * EVENT_LOOP_SAMPLE_MS): how long the process itself was held beyond one sampling period, apart from
   * the clients' share of the machine's cores. A hold shorter than the period can fall between two ticks.
   */
  server_loop_p99_ms: number | null;
  server_loop_max_ms: number | null;
  server_loop_quiet_max_ms: number | null;
  /**
   * The well-behaved agent's slowest call as the server timed it, in the attack and in its quiet
   * window: the bound (ms) of the countersign_tool_call_seconds bucket it fell in (Infinity past 30 s).
   */
  server_call_max_ms: number | null;
  server_call_quiet_max_ms: number | null;
  /** The well-behaved agent's own process held up at most this long (ms; the server had no part in it). */
  good_held_max_ms: number | null;
  quiet_held_max_ms: number | null;
  /** The well-behaved agent's slowest call in the attack's window and in the quiet one (ms, and s into it). */
  good_slowest: Window['slowest'];
  quiet_slowest: Window['slowest'];
  /** The drill process's own event-loop delay (the attackers' side: it sends the floods). */
  drill_loop_max_ms: number | null;
  drill_loop_quiet_max_ms: number | null;
  rss_mb: number;
  /** What the attack had to show, and whether it did. */
  expect: string;
  ok: boolean;
}

/** The well-behaved agent's p99 during an attack may be at most this many times its quiet p99. */
const LATENCY_BOUND = 3;
/** Each attack's quiet window: at least this long, and at least QUIET_CALLS calls of the agent. */
const QUIET_MS = 5000;
const QUIET_CALLS = 100;
/** The tool the well-behaved agent calls (and only it). */
const GOOD_TOOL = 'isphere_search_contacts';
/** Before the first quiet window: the agent's first calls (connections, compiled code) are not judged. */
const WARMUP_MS = 5000;

/** One call of the well-behaved agent: when it started (Date.now()), how long it took, and whether it was ok. */
interface Sample {
  at: number;
  ms: number;
  ok: boolean;
}

interface Window {
  p99: number | null;
  calls: number;
  failed: number;
  /** The agent process's own event loop held up at most this long in the window (ms): not the server. */
  held_max: number | null;
  /** The window's slowest call: how long it took (ms), and when it started (s into the window). */
  slowest: { ms: number; at_s: number } | null;
}

/**
 * How often the well-behaved agent searches. Every 25 ms gives an attack of a few seconds well over
 * 100 calls, so its p99 is not simply its slowest call (a nearest-rank p99 of fewer than 100 is).
 */
const BYSTANDER_EVERY_MS = 25;

/** How often the agent's process looks at its own event loop, and the delay below which it keeps nothing. */
const HELD_EVERY_MS = 10;
const HELD_KEPT_MS = 2;

/**
 * The well-behaved agent, in a process of its own (this file run with the argument `bystander`): a
 * search every BYSTANDER_EVERY_MS, each latency kept with when it started. In the drill's process it would wait
 * behind the attackers' own work (a flood's answers, 100,000-character names), which an attacker on
 * another machine would not put in its way.
 */
async function runBystander(url: string, token: string, send: (m: unknown) => void) {
  const client = await connect(url, token);
  const samples: Sample[] = [];
  // Whenever a 10 ms timer fires late, by how much and when: a call's latency includes any such stall.
  const held: { at: number; ms: number }[] = [];
  let tick = performance.now();
  const watch = setInterval(() => {
    const now = performance.now();
    if (now - tick - HELD_EVERY_MS > HELD_KEPT_MS)
      held.push({ at: Date.now(), ms: now - tick - HELD_EVERY_MS });
    tick = now;
  }, HELD_EVERY_MS);
  let stopped = false;
  const loop = (async () => {
    for (let next = Date.now(); !stopped;) {
      const at = Date.now();
      const t0 = performance.now();
      const ok = await callTool(client, GOOD_TOOL, { query: 'alice', limit: 10 }, 20_000)
        .then((r) => r.envelope.ok === true)
        .catch(() => false);
      samples.push({ at, ms: performance.now() - t0, ok });
      next += BYSTANDER_EVERY_MS;
      await sleep(Math.max(0, next - Date.now()));
    }
    clearInterval(watch);
  })();
  process.on('message', (m: { id: number; from?: number; to?: number; stop?: boolean }) => {
    if (m.stop) {
      stopped = true;
      void loop
        .then(() => client.close())
        .finally(() => {
          send({ id: m.id, stopped: true });
          process.disconnect();
        });
      return;
    }
    const within = (at: number) => at >= m.from! && at < m.to!;
    const inside = samples.filter((s) => within(s.at));
    const ms = inside.map((s) => s.ms);
    const window: Window = {
      p99: ms.length ? round(percentile(ms, 99), 1) : null,
      calls: inside.length,
      failed: inside.filter((s) => !s.ok).length,
      held_max: round(Math.max(0, ...held.filter((h) => within(h.at)).map((h) => h.ms)), 1),
      slowest: inside.reduce<Window['slowest']>(
        (worst, s) =>
          worst && worst.ms >= s.ms ? worst : { ms: round(s.ms, 1), at_s: round((s.at - m.from!) / 1000, 1) },
        null,
      ),
    };
    send({ id: m.id, window });
  });
  send({ ready: true });
}

/**
 * The drill's side of the well-behaved agent: names the phase of the moment (the attack, or the quiet
 * window before it) and asks the agent's process for the figures of a phase, by its span of time.
 */
class Bystander {
  private readonly spans = new Map<string, { from: number; to?: number }>();
  private current?: string;
  private asked = 0;
  private readonly answers = new Map<number, (m: { window?: Window; stopped?: boolean }) => void>();
  private constructor(private readonly child: ChildProcess) {
    child.on('message', (m: { id?: number; window?: Window; stopped?: boolean }) => {
      if (m.id !== undefined) this.answers.get(m.id)?.(m);
    });
  }

  /** Forks the agent's process (on the CPUs of this one) and waits until it has connected. */
  static async start(url: string, token: string): Promise<Bystander> {
    const child = fork(fileURLToPath(import.meta.url), ['bystander'], {
      cwd: ROOT,
      execArgv: ['--import', 'tsx'],
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
    });
    await new Promise<void>((resolve, reject) => {
      child.once('message', () => resolve());
      child.once('exit', (code) => reject(new Error(`the well-behaved agent exited with ${code}`)));
      child.send({ url, token });
    });
    return new Bystander(child);
  }

  get pid(): number {
    return this.child.pid!;
  }

  set phase(name: string) {
    const now = Date.now();
    if (this.current) this.spans.get(this.current)!.to = now;
    this.spans.set(name, { from: now });
    this.current = name;
  }

  private ask<T>(message: Record<string, unknown>): Promise<T> {
    const id = ++this.asked;
    return new Promise((resolve) => {
      this.answers.set(id, (m) => {
        this.answers.delete(id);
        resolve(m as T);
      });
      this.child.send({ id, ...message });
    });
  }

  /** The calls started while `phase` was the phase (until now, if it still is). */
  async of(phase: string): Promise<Window> {
    const span = this.spans.get(phase);
    if (!span) return { p99: null, calls: 0, failed: 0, held_max: null, slowest: null };
    return (await this.ask<{ window: Window }>({ from: span.from, to: span.to ?? Date.now() })).window;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    await this.ask({ stop: true });
    await exited;
  }
}

/** Counts answers by label. */
const tally = (labels: string[]) =>
  labels.reduce<Record<string, number>>((n, l) => ({ ...n, [l]: (n[l] ?? 0) + 1 }), {});

/** Runs `total` requests `parallel` at a time; each resolves with its label. */
async function burst(
  total: number,
  parallel: number,
  one: (i: number) => Promise<string>,
  until = 0,
): Promise<string[]> {
  const labels: string[] = [];
  for (let i = 0; i < total || Date.now() < until; i += parallel) {
    const batch = Array.from({ length: i < total ? Math.min(parallel, total - i) : parallel }, (_, j) =>
      one(i + j).catch((err: unknown) => `error: ${(err as Error).message.slice(0, 60)}`),
    );
    labels.push(...(await Promise.all(batch)));
  }
  return labels;
}

/** An HTTP answer's label: its status, and the problem's reason or code when it has one. */
async function label(res: Response): Promise<string> {
  const text = await res.text();
  const reason = /"reason"\s*:\s*"([^"]+)"|reason: ([a-z_]+)/.exec(text);
  return `${res.status}${reason ? ` ${reason[1] ?? reason[2]}` : ''}`;
}

/** A login form's token and cookie, fetched once and posted many times (a burst from one page). */
async function loginForm(base: string) {
  const page = await fetch(new URL('/login', base));
  const html = await page.text();
  const csrf = /name="_csrf" value="([^"]*)"/.exec(html)?.[1] ?? '';
  const cookie = page.headers
    .getSetCookie()
    .map((c) => c.split(';')[0])
    .join('; ');
  return (name: string, password: string, next = '/approvals') =>
    fetch(new URL('/login', base), {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded', cookie },
      body: new URLSearchParams({ _csrf: csrf, next, name, password }).toString(),
    });
}

/** A 2026-07-28 client, whose refused listen requests are labelled by their HTTP answer. */
async function listener(url: string, token: string, refused: string[]) {
  const client = new Client(
    { name: 'countersign-drill-abuse', version: '1.0.0' },
    { versionNegotiation: { mode: { pin: '2026-07-28' } } },
  );
  await client.connect(
    new StreamableHTTPClientTransport(new URL('/mcp', url), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
      fetch: async (input, init) => {
        const res = await fetchUnwarned(input, init);
        if (typeof init?.body === 'string' && init.body.includes('"subscriptions/listen"') && !res.ok)
          refused.push(await label(res.clone()));
        return res;
      },
    }),
  );
  return client;
}

const SLACK_SECRET = 'drill-slack-signing-secret';

export interface AbuseOptions {
  dbUrl: string;
  dataDir: string;
  /** The seeded agent's token (the well-behaved one) and the seeded chair. */
  token: string;
  /** Extra environment of the server (the drill's settings). */
  env: Record<string, string>;
  /** Requests of the flooding attacks (bad tokens: this many; the others a fraction). */
  flood: number;
  /** Each flood goes on this long at least, past its count (0: the counts only; `--sustain S`). */
  sustainMs?: number;
  /**
   * Only the attacks whose names contain one of these (`--only`), each `repeat` times (`--repeat`), each
   * time after a quiet window of its own: for working on one attack, not for the drill's verdict.
   */
  only?: string[];
  repeat?: number;
  log: (line: string) => void;
  /** The CLI, run against the drill's database. */
  cli: (args: string[]) => Promise<{ code: number; out: string }>;
  /** Pin the server and the attackers to CPUs of their own where the machine allows (default true). */
  pin?: boolean;
  /** The processes of the drill's own PostgreSQL, pinned with the server: the box under attack. */
  databasePids?: () => number[];
}

/** The CPUs process `pid` may run on, from `taskset -c -p` (e.g. "0,1" or "0-3,6"). */
function affinity(pid: number): number[] {
  const out = execFileSync('taskset', ['-c', '-p', String(pid)], { encoding: 'utf8' });
  const list = /list:\s*(\S+)/.exec(out)?.[1] ?? '';
  return list.split(',').flatMap((part) => {
    const [from, to] = part.split('-').map(Number);
    return to === undefined ? [from!] : Array.from({ length: to - from! + 1 }, (_, i) => from! + i);
  });
}

/** Every thread of `pid` (`taskset -a`) onto the CPUs of `cpus`, a taskset list. */
const pinTo = (pid: number, cpus: string) =>
  void execFileSync('taskset', ['-a', '-c', '-p', cpus, String(pid)], { stdio: 'ignore' });

/** Where the server and the attackers go, or why nothing is pinned. */
type Pinning = { server: string; attackers: string; before: string } | { none: string };

/** Where the server and the attackers go; the drill itself is moved onto the attackers' CPUs at once. */
function planPinning(wanted: boolean): Pinning {
  if (!wanted) return { none: 'nothing pinned (--no-pin)' };
  const parallel = os.availableParallelism();
  if (parallel < 2) return { none: `nothing pinned: os.availableParallelism() is ${parallel}` };
  try {
    const cpus = affinity(process.pid);
    if (cpus.length < 2)
      return { none: `nothing pinned: this process may run on CPU ${cpus.join(',')} only` };
    const plan = { server: String(cpus[0]), attackers: cpus.slice(1).join(','), before: cpus.join(',') };
    pinTo(process.pid, plan.attackers);
    return plan;
  } catch (err) {
    const e = err as { code?: string; status?: number };
    const code = e.code ?? `exit ${e.status}`;
    return {
      none: `nothing pinned: ${code === 'ENOENT' ? 'taskset not found' : `taskset failed (${code})`}`,
    };
  }
}

/** Every thread of `pid` at `nice` (setpriority on a process changes its main thread only, on Linux). */
function reniceAll(pid: number, nice: number): void {
  let tids: string[];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    tids = [String(pid)];
  }
  for (const tid of tids) {
    try {
      os.setPriority(Number(tid), nice);
    } catch {
      // the thread has ended
    }
  }
}

/** The drill process's own event-loop delay since the last call (ms; 10 ms resolution, as the server's). */
function drillLoop() {
  const h = monitorEventLoopDelay({ resolution: 10 });
  h.enable();
  return () => {
    const seen = h.count > 0 ? { p99: round(h.percentile(99) / 1e6, 1), max: round(h.max / 1e6, 1) } : null;
    h.reset();
    return seen;
  };
}

interface Scrape {
  /** The server's event-loop delay since the last scrape of /metrics (ms). */
  p99: number | null;
  max: number | null;
  /** countersign_tool_call_seconds of GOOD_TOOL: calls so far at or under each bucket's bound (ms). */
  buckets: Map<number, number>;
}

/** The server's own figures, read off a scrape of /metrics. */
async function scrape(base: string): Promise<Scrape> {
  const text = await fetch(new URL('/metrics', base)).then((r) => r.text());
  // Each sample is the time between two ticks of a timer of EVENT_LOOP_SAMPLE_MS: the hold is the rest.
  const figure = (name: string) => {
    const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
    return m ? round(Math.max(0, Number(m[1]) * 1000 - EVENT_LOOP_SAMPLE_MS), 1) : null;
  };
  const buckets = new Map<number, number>();
  for (const line of text.split('\n')) {
    if (!line.startsWith('countersign_tool_call_seconds_bucket{') || !line.includes(`tool="${GOOD_TOOL}"`))
      continue;
    const le = /le="([^"]+)"/.exec(line)?.[1];
    if (le)
      buckets.set(le === '+Inf' ? Infinity : round(Number(le) * 1000, 1), Number(line.split(' ').at(-1)));
  }
  return {
    p99: figure('nodejs_eventloop_lag_p99_seconds'),
    max: figure('nodejs_eventloop_lag_max_seconds'),
    buckets,
  };
}

/**
 * The slowest of the well-behaved agent's calls between two scrapes as the server timed it (its
 * tool-call histogram, audit append included): the bound of the bucket it fell in, in ms.
 */
function slowestServerSide(before: Scrape, after: Scrape): number | null {
  let slowest: number | null = null;
  let below = 0;
  for (const [le, n] of [...after.buckets].sort((a, b) => a[0] - b[0])) {
    const inside = n - (before.buckets.get(le) ?? 0);
    if (inside > below) slowest = le;
    below = inside;
  }
  return slowest;
}

/** The audit table's row count. */
async function auditRows(dbUrl: string): Promise<number> {
  const db = await openDatabase({ url: dbUrl, pgliteDir: '', command: 'drill check' });
  try {
    const row = (await db.knex('audit_events').count({ n: '*' }).first()) as { n: unknown };
    return Number(row.n);
  } finally {
    await db.close();
  }
}

/** The first seconds of a second server on the same database, probed all along: nothing may hang. */
async function startupWindow(o: AbuseOptions) {
  const port = await freePort();
  const labels: string[] = [];
  let ready = false;
  // /healthz and an MCP request in turn: the first says `starting`, the second is a problem document.
  const request = (i: number) =>
    i % 2
      ? fetch(`http://127.0.0.1:${port}/healthz`).then(
          async (r) => `healthz ${r.status} ${String(((await r.json()) as { status?: unknown }).status)}`,
        )
      : fetch(`http://127.0.0.1:${port}/mcp`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
        }).then(async (r) => `mcp ${await label(r)}`);
  const probe = async () => {
    for (let i = 0; !ready; i++) {
      const answered = await Promise.race([
        request(i).catch((err: Error & { cause?: { code?: string } }) =>
          err.cause?.code === 'ECONNREFUSED' ? 'not listening' : `error ${err.cause?.code ?? err.message}`,
        ),
        sleep(5000).then(() => 'HUNG 5 s'),
      ]);
      labels.push(answered);
      await sleep(5);
    }
  };
  const probing = probe();
  const t0 = Date.now();
  const second = await spawnCountersign({
    DATABASE_URL: o.dbUrl,
    COUNTERSIGN_DATA_DIR: o.dataDir,
    ...o.env,
    COUNTERSIGN_PORT: String(port),
  });
  ready = true;
  await probing;
  await second.stop();
  return { labels, seconds: (Date.now() - t0) / 1000 };
}

export async function abuseDrill(
  o: AbuseOptions,
): Promise<{ report: InvariantReport; extra: Record<string, unknown> }> {
  const checks: InvariantReport['checks'] = [];
  const figures: AttackFigures[] = [];
  const load = { before: os.loadavg().map((l) => round(l, 2)), after: [] as number[] };
  o.log(`  load average before: ${load.before.join(', ')} (${os.availableParallelism()} CPUs)`);
  // The drill (every attacker's request) on the attackers' CPUs from now on: what it starts (the hostile
  // upstream, the well-behaved agent, the CLI) starts there too.
  const pinning = planPinning(o.pin ?? true);
  const drillLoopDelay = drillLoop();
  // The hostile upstream in a process of its own: its 64 MiB answers cost it, not the drill's clients.
  const hostile = await spawnNode(
    [path.join(ROOT, 'test/helpers/hostile-upstream.ts'), 'http'],
    {},
    /"url":"([^"]+)"/,
  );
  // Niced, every thread: on a machine of two cores the attacker's own work (making 64 MiB answers, and
  // collecting them) would otherwise be what the well-behaved agent waits for, where an attacker
  // elsewhere would cost this server nothing. os.setPriority(pid) alone nices the main thread only.
  reniceAll(hostile.pid, 19);
  if ('server' in pinning) pinTo(hostile.pid, pinning.attackers);
  const configFile = path.join(o.dataDir, 'abuse-config.json');
  fs.writeFileSync(
    configFile,
    JSON.stringify({
      upstreams: [{ name: 'hostile', url: hostile.url }],
      // A rule with a pattern that backtracks catastrophically on JavaScript's engine: rules run on RE2.
      approval: { rules: { rules: [CATASTROPHIC_RULE] } },
    }),
  );

  // The attackers' agents, and the people whose sign-ins are attacked.
  const seed = await openDatabase({ url: o.dbUrl, pgliteDir: '', command: 'drill seed' });
  seedHostRoots(seed.knex, o.dataDir);
  const limited = await createAgent(seed.knex, { name: 'flooder', rate_limit_per_min: 60 });
  const caller = await createAgent(seed.knex, { name: 'upstream-caller' });
  const streamer = await createAgent(seed.knex, { name: 'streamer' });
  await createUser(seed.knex, { name: 'ines', roles: ['chair'], password: 'ines password' });
  await createUser(seed.knex, { name: 'target', roles: ['chair'], password: 'target password' });
  await seed.close();

  const port = await freePort();
  const env = {
    ...o.env,
    COUNTERSIGN_CONFIG: configFile,
    COUNTERSIGN_PORT: String(port),
    COUNTERSIGN_SLACK_BOT_TOKEN: 'xoxb-drill',
    COUNTERSIGN_SLACK_SIGNING_SECRET: SLACK_SECRET,
    COUNTERSIGN_SLACK_CHANNEL: 'C0DRILL',
    // Nothing listens there: a refused callback never reaches Slack or the provider anyway.
    COUNTERSIGN_SLACK_API_BASE_URL: 'http://127.0.0.1:9/api/',
    COUNTERSIGN_OIDC_ISSUER: 'https://login.example.com/realms/staff',
    COUNTERSIGN_OIDC_CLIENT_ID: 'countersign-web',
    COUNTERSIGN_OIDC_CLIENT_SECRET: 'drill-client-secret',
    COUNTERSIGN_OIDC_ROLES: 'cs-chairs=chair',
  };

  o.log('  startup: probing /healthz of a second server from its first instant');
  const startup = await startupWindow({ ...o, env });

  let server: Child | undefined;
  let bystander: Bystander | undefined;
  const clients: Client[] = [];
  try {
    server = await spawnCountersign({ DATABASE_URL: o.dbUrl, COUNTERSIGN_DATA_DIR: o.dataDir, ...env });
    const base = server.url;
    const pid = server.pid;
    if ('server' in pinning) pinTo(pid, pinning.server);
    // The server's database is on the box under attack too: its processes on the server's CPU (the
    // backends the server opens later are forked from the postmaster, and inherit it).
    const databasePids = 'server' in pinning ? (o.databasePids?.() ?? []) : [];
    for (const dbPid of databasePids) pinTo(dbPid, (pinning as { server: string }).server);
    // Forked from the drill: on the drill's CPUs.
    bystander = await Bystander.start(base, o.token);
    const processes =
      `the drill (pid ${process.pid}: floods, CLI), the well-behaved agent (pid ${bystander.pid}) ` +
      `and the hostile upstream (pid ${hostile.pid}, nice 19)`;
    o.log(
      'server' in pinning
        ? `  pinned (taskset -a): the server (pid ${pid}) to CPU ${pinning.server}; ${processes} to CPU ` +
            `${pinning.attackers}; ${
              databasePids.length
                ? `the drill's PostgreSQL (${databasePids.length} processes) with the server`
                : 'PostgreSQL where the machine puts it'
            }`
        : `  ${pinning.none}: the server (pid ${pid}), ${processes}`,
    );
    // The upstream is connected in the background: wait until its tools are listed.
    const upstreamClient = await connect(base, caller.token);
    clients.push(upstreamClient);
    for (let i = 0; i < 150; i++) {
      const names = (await upstreamClient.listTools()).tools.map((t) => t.name);
      if (names.includes('hostile__match')) break;
      await sleep(200);
    }

    const startupFigure: AttackFigures = {
      attack: 'startup window',
      requests: startup.labels.length,
      answers: tally(startup.labels),
      audit_rows: 0,
      seconds: round(startup.seconds, 1),
      good_p99_ms: null,
      good_calls: 0,
      good_failed: 0,
      quiet_p99_ms: null,
      quiet_calls: 0,
      quiet_failed: 0,
      ratio: null,
      rss_mb: 0,
      server_loop_p99_ms: null,
      server_loop_max_ms: null,
      server_loop_quiet_max_ms: null,
      server_call_max_ms: null,
      server_call_quiet_max_ms: null,
      good_held_max_ms: null,
      quiet_held_max_ms: null,
      good_slowest: null,
      quiet_slowest: null,
      drill_loop_max_ms: null,
      drill_loop_quiet_max_ms: null,
      expect:
        'every probe answered: refused before it listens, then 503 starting (healthz and MCP alike), then ready; none hung',
      ok: startup.labels.every((l) =>
        ['not listening', 'healthz 503 starting', 'mcp 503 starting', 'healthz 200', 'mcp 401'].some(
          (w) => l === w || l.startsWith(`${w} `),
        ),
      ),
    };
    figures.push(startupFigure);

    const agent = bystander;
    agent.phase = 'warm-up';
    await sleep(WARMUP_MS);
    const warmup = await agent.of('warm-up');
    o.log(`  warm-up: the well-behaved agent's p99 ${warmup.p99} ms over ${warmup.calls} calls (not judged)`);

    const attackOnce = async (
      name: string,
      expect: string,
      run: (until: number) => Promise<string[]>,
      judge: (answers: Record<string, number>) => boolean,
    ) => {
      // The quiet window just before the attack: the baseline it is judged against.
      const quietPhase = `quiet before ${name}`;
      agent.phase = quietPhase;
      const quietFrom = await scrape(base); // restarts the server's event-loop figures
      drillLoopDelay();
      const q0 = Date.now();
      while (Date.now() - q0 < QUIET_MS || (await agent.of(quietPhase)).calls < QUIET_CALLS) await sleep(100);
      const quietLoop = await scrape(base); // and restarts them for the attack
      const quietDrillLoop = drillLoopDelay();
      const quiet = await agent.of(quietPhase);
      const rows0 = await auditRows(o.dbUrl);
      agent.phase = name;
      const t0 = Date.now();
      // A flood sends its count, and with --sustain goes on for that long at least.
      const labels = await run(t0 + (o.sustainMs ?? 0));
      const seconds = (Date.now() - t0) / 1000;
      // The well-behaved agent a moment longer under the same label (2 s), and until the window has
      // as many calls as a quiet window at least: both p99s are taken over as many calls (a
      // nearest-rank p99 of 85 calls is the slowest of them, of 200 the second slowest).
      await sleep(2000);
      while (Date.now() - t0 < QUIET_MS || (await agent.of(name)).calls < QUIET_CALLS) await sleep(100);
      const answers = tally(labels);
      const seen = await agent.of(name);
      const loop = await scrape(base);
      const attackDrillLoop = drillLoopDelay();
      const ratio = seen.p99 !== null && quiet.p99 ? round(seen.p99 / quiet.p99, 2) : null;
      const f: AttackFigures = {
        attack: name,
        requests: labels.length,
        answers,
        audit_rows: (await auditRows(o.dbUrl)) - rows0,
        seconds: round(seconds, 1),
        good_p99_ms: seen.p99,
        good_calls: seen.calls,
        good_failed: seen.failed,
        quiet_p99_ms: quiet.p99,
        quiet_calls: quiet.calls,
        quiet_failed: quiet.failed,
        ratio,
        rss_mb: round(statusMb(pid, 'VmRSS'), 1),
        server_loop_p99_ms: loop.p99,
        server_loop_max_ms: loop.max,
        server_loop_quiet_max_ms: quietLoop.max,
        server_call_max_ms: slowestServerSide(quietLoop, loop),
        server_call_quiet_max_ms: slowestServerSide(quietFrom, quietLoop),
        good_held_max_ms: seen.held_max,
        quiet_held_max_ms: quiet.held_max,
        good_slowest: seen.slowest,
        quiet_slowest: quiet.slowest,
        drill_loop_max_ms: attackDrillLoop?.max ?? null,
        drill_loop_quiet_max_ms: quietDrillLoop?.max ?? null,
        expect,
        ok: judge(answers),
      };
      figures.push(f);
      o.log(
        `  ${name}: ${f.requests} requests in ${f.seconds} s ${JSON.stringify(answers)}; ${f.audit_rows} audit rows; ` +
          `well-behaved p99 ${f.good_p99_ms} ms (${seen.failed}/${seen.calls} failed) against ${f.quiet_p99_ms} ms ` +
          `quiet just before (${quiet.failed}/${quiet.calls} failed): ${ratio}×; ` +
          `slowest ${seen.slowest?.ms} ms at ${seen.slowest?.at_s} s (quiet ${quiet.slowest?.ms} ms at ${quiet.slowest?.at_s} s); ` +
          `its slowest call server-side ≤ ${f.server_call_max_ms} ms (quiet ≤ ${f.server_call_quiet_max_ms} ms); ` +
          `server event loop held (beyond its ${EVENT_LOOP_SAMPLE_MS} ms sampling) p99 ${f.server_loop_p99_ms} ms, max ${f.server_loop_max_ms} ms (quiet max ${f.server_loop_quiet_max_ms} ms); ` +
          `the agent's own process held at most ${f.good_held_max_ms} ms (quiet ${f.quiet_held_max_ms} ms); ` +
          `drill event loop max ${f.drill_loop_max_ms} ms (quiet ${f.drill_loop_quiet_max_ms} ms); RSS ${f.rss_mb} MB`,
      );
    };
    /** An attack, unless --only leaves it out, --repeat times. */
    /**
     * An attack, unless --only leaves it out, --repeat times; `prime` first, once, outside every window.
     * The first call of a tool costs the drill's client more than the next ones (its SDK client compiles
     * the tool's output schema into a validator, in this process): on the CPU the well-behaved agent
     * shares with the drill, that one-time cost showed as the attack's (round 1 of the rule-pattern
     * attack: the drill's event loop held 308-1,102 ms, rounds 2 and 3 not). An attacker elsewhere
     * pays it on its own machine; the prime pays it here before the quiet window, and says how long
     * it held the drill.
     */
    const attack = async (
      ...[name, expect, run, judge, prime]: [...Parameters<typeof attackOnce>, (() => Promise<unknown>)?]
    ) => {
      if (o.only && !o.only.some((part) => name.includes(part))) return;
      if (prime) {
        drillLoopDelay();
        const t0 = performance.now();
        await prime();
        const held = drillLoopDelay();
        o.log(
          `  ${name}: primed the attacker's client (${round(performance.now() - t0, 1)} ms; the drill's event loop held at most ${held?.max ?? 0} ms)`,
        );
      }
      for (let i = 0; i < (o.repeat ?? 1); i++) await attackOnce(name, expect, run, judge);
    };
    const n = (share: number) => Math.max(20, Math.round(o.flood * share));

    await attack(
      'bad bearer tokens',
      'every one 401, the rows bounded (N a minute per address and reason, then one summary)',
      (until) =>
        burst(
          o.flood,
          20,
          () =>
            fetch(new URL('/mcp', base), {
              method: 'POST',
              headers: {
                // The shape of an issued token (cs_ and 55 characters), none of them issued.
                authorization: `Bearer cs_${randomBytes(41).toString('base64url')}`,
                'content-type': 'application/json',
                accept: 'application/json, text/event-stream',
              },
              body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
            }).then(label),
          until,
        ),
      (a) => Object.keys(a).every((k) => k.startsWith('401')),
    );

    await attack(
      'unsigned Slack callbacks',
      'every one refused 401, the rows bounded',
      (until) =>
        burst(
          n(0.15),
          20,
          (i) => {
            const body = new URLSearchParams({
              payload: JSON.stringify({ type: 'block_actions', i }),
            }).toString();
            const timestamp = String(Math.floor(Date.now() / 1000));
            const forged = createHmac('sha256', 'not-the-secret')
              .update(`v0:${timestamp}:${body}`)
              .digest('hex');
            return fetch(new URL('/slack/interactions', base), {
              method: 'POST',
              headers: {
                'content-type': 'application/x-www-form-urlencoded',
                'x-slack-request-timestamp': timestamp,
                'x-slack-signature': `v0=${forged}`,
              },
              body,
            }).then(label);
          },
          until,
        ),
      (a) => Object.keys(a).every((k) => k.startsWith('401')),
    );

    await attack(
      'forged single sign-on callbacks',
      'the first 20 refused (400 no_attempt), the rest 429; then the right password still signs in',
      async (until) => {
        const labels = await burst(
          n(0.15),
          20,
          (i) =>
            fetch(new URL(`/login/oidc/callback?code=c${i}&state=s${i}`, base), { redirect: 'manual' }).then(
              label,
            ),
          until,
        );
        const post = await loginForm(base);
        const signedIn = await post('ines', 'ines password');
        return [...labels, `password sign-in ${signedIn.status}`];
      },
      (a) =>
        a['password sign-in 303'] === 1 &&
        (a['400 no_attempt'] ?? 0) <= 20 &&
        Object.keys(a).every((k) =>
          ['400 no_attempt', '429 too_many_attempts', 'password sign-in 303'].includes(k),
        ),
    );

    await attack(
      'unknown tools past the rate limit',
      'an agent limited to 60 a minute: at most 60 answered, the rest RATE_LIMITED; names of 100,000 characters',
      async (until) => {
        const flooder = await connect(base, limited.token);
        clients.push(flooder);
        const long = 'x'.repeat(100_000);
        return burst(
          n(0.15),
          10,
          async (i) => {
            const r = await flooder
              .callTool({ name: `no_such_tool_${i}_${long}`, arguments: {} }, { timeout: 20_000 })
              .then(
                (res) =>
                  (res.structuredContent as { error?: { code?: string } } | undefined)?.error?.code ?? 'ok',
                (err: { data?: { code?: string } }) => err.data?.code ?? 'no code',
              );
            return r;
          },
          until,
        );
      },
      (a) =>
        (a.RATE_LIMITED ?? 0) > 0 &&
        Object.keys(a).every((k) => ['RATE_LIMITED', 'UNKNOWN_TOOL'].includes(k)),
    );

    const metrics = await fetch(new URL('/metrics', base)).then((r) => r.text());
    checks.push({
      name: '/metrics stays small after a flood of unknown tool names',
      ok: metrics.length < 1_000_000,
      detail: `${metrics.length} bytes`,
    });

    await attack(
      'catastrophic rule pattern',
      "a rule matches ^(\\w+\\s?)*$ against 10,000 characters: each draft answered (pending, a chair reviews); the bystander's p99 holds",
      (until) =>
        burst(
          20,
          4,
          (i) =>
            callTool(
              upstreamClient,
              'isphere_send_message',
              { target_type: 'contact', target_id: 'ct_alice', content_text: `${'a'.repeat(10_000)} ${i}!` },
              30_000,
            ).then(
              (r) =>
                r.envelope.ok
                  ? String((r.envelope.approval as { status?: string } | undefined)?.status ?? 'ok')
                  : String((r.envelope.error as { code?: string } | undefined)?.code ?? 'no code'),
              (err: { data?: { code?: string } }) => err.data?.code ?? 'no code',
            ),
          until,
        ),
      (a) => Object.keys(a).every((k) => k === 'pending'),
      // One short draft (plain words: the rule lets it through, a dry run sends nothing).
      () =>
        callTool(
          upstreamClient,
          'isphere_send_message',
          { target_type: 'contact', target_id: 'ct_alice', content_text: 'a short plain draft' },
          30_000,
        ),
    );

    await attack(
      'catastrophic upstream pattern',
      "each call refused at once (the pattern runs in linear time); the bystander's p99 holds",
      (until) =>
        burst(
          20,
          4,
          (i) =>
            callTool(upstreamClient, 'hostile__match', { s: 'a'.repeat(33 + i) + '!' }, 30_000).then(
              (r) =>
                String(
                  (r.envelope.error as { code?: string } | undefined)?.code ??
                    (r.envelope.ok ? 'ok' : 'no code'),
                ),
              (err: { data?: { code?: string } }) => err.data?.code ?? 'no code',
            ),
          until,
        ),
      (a) => Object.keys(a).every((k) => k === 'INVALID_ARGUMENT'),
    );

    await attack(
      'upstream answers of 64 MiB',
      'each refused CONNECTOR_FAILED (result_too_large, past max_result_bytes = 8 MiB); the server stays up',
      (until) =>
        burst(
          6,
          2,
          () =>
            callTool(upstreamClient, 'hostile__big', { bytes: 64 * 1024 * 1024 }, 60_000).then(
              (r) => {
                const e = r.envelope.error as { code?: string; reason?: string } | undefined;
                return e ? `${e.code} ${e.reason ?? ''}`.trim() : 'ok';
              },
              (err: { data?: { code?: string } }) => err.data?.code ?? 'no code',
            ),
          until,
        ),
      (a) => Object.keys(a).every((k) => k === 'CONNECTOR_FAILED result_too_large'),
    );

    await attack(
      'listen streams of one agent',
      '8 open (http.max_streams_per_agent), the rest 429 too_many_streams; all closed once the agent is revoked',
      async () => {
        const refused: string[] = [];
        const opened: { closed: Promise<unknown> }[] = [];
        for (let i = 0; i < 40; i++) {
          const c = await listener(base, streamer.token, refused);
          clients.push(c);
          await c.listen({ toolsListChanged: true }).then(
            (sub) => void opened.push(sub),
            () => undefined,
          );
        }
        const revoked = await o.cli(['agent', 'revoke', 'streamer']);
        const closed = await Promise.race([
          Promise.all(opened.map((s) => s.closed)).then(() => true),
          sleep(10_000).then(() => false),
        ]);
        return [
          ...opened.map(() => 'open'),
          ...refused,
          `revoked ${revoked.code === 0 ? 'ok' : 'failed'}`,
          closed ? 'all closed' : 'LEFT OPEN',
        ];
      },
      (a) => a.open === 8 && a['all closed'] === 1 && (a['429 too_many_streams'] ?? 0) === 32,
    );

    await attack(
      'small edges',
      'an Origin on another port 403, /static/<missing> 404, a sign-in whose next is beyond Latin-1 303',
      async () => {
        const foreign = new URL(base);
        foreign.port = String(Number(foreign.port) + 1);
        const origin = await fetch(new URL('/login', base), { headers: { origin: foreign.origin } }).then(
          label,
        );
        const missing = await fetch(new URL('/static/no-such-file.css', base)).then(label);
        const post = await loginForm(base);
        const next = await post('ines', 'ines password', '/audit?q=日本語 ✓').then((r) => String(r.status));
        return [`origin ${origin}`, `static ${missing}`, `next ${next}`];
      },
      (a) =>
        a['origin 403 origin_not_allowed'] === 1 &&
        Object.keys(a).some((k) => k.startsWith('static 404')) &&
        a['next 303'] === 1,
    );

    await attack(
      'simultaneous wrong passwords',
      '60 at once for one user: at most 5 checked (401), the rest 429, and then the right one 429 too',
      async () => {
        const post = await loginForm(base);
        const labels = await burst(60, 60, (i) => post('target', `wrong ${i}`).then((r) => String(r.status)));
        const right = await post('target', 'target password');
        return [...labels, `right password ${right.status}`];
      },
      (a) => (a['401'] ?? 0) <= 5 && a['right password 429'] === 1,
    );

    await agent.stop();
    const crashed = server.child.exitCode !== null || server.child.signalCode !== null;
    const peak = statusMb(pid, 'VmHWM');
    for (const f of figures) {
      checks.push({ name: `${f.attack}: ${f.expect}`, ok: f.ok, detail: JSON.stringify(f.answers) });
    }
    const judged = figures.filter((f) => f.good_p99_ms !== null);
    const over = judged.filter((f) => f.ratio === null || f.ratio > LATENCY_BOUND);
    checks.push({
      name: `the well-behaved agent's p99 within ${LATENCY_BOUND}× the quiet p99 of the window just before, during every attack`,
      ok: judged.length > 0 && over.length === 0,
      detail: `${over.length ? `over: ${over.map((f) => f.attack).join(', ')}; ` : ''}${judged
        .map((f) => `${f.attack}: ${f.good_p99_ms}/${f.quiet_p99_ms} ms ${f.ratio}×`)
        .join(', ')}`,
    });
    checks.push({
      name: 'the server never went down',
      ok: !crashed,
      detail: `peak RSS ${Math.round(peak)} MB`,
    });
    load.after = os.loadavg().map((l) => round(l, 2));
    o.log(`  load average after: ${load.after.join(', ')}`);
    o.log(
      '  | attack | quiet p99 (calls) | p99 (calls) | ratio | slowest server-side, quiet / attack | server loop held max, quiet / attack | agent held max, quiet / attack | drill loop max, quiet / attack |',
    );
    for (const f of judged) {
      o.log(
        `  | ${f.attack} | ${f.quiet_p99_ms} ms (${f.quiet_calls}) | ${f.good_p99_ms} ms (${f.good_calls}) | ` +
          `${f.ratio}×${f.ratio !== null && f.ratio <= LATENCY_BOUND ? '' : ' OVER'} | ` +
          `≤ ${f.server_call_quiet_max_ms} / ≤ ${f.server_call_max_ms} ms | ` +
          `${f.server_loop_quiet_max_ms} / ${f.server_loop_max_ms} ms | ${f.quiet_held_max_ms} / ${f.good_held_max_ms} ms | ` +
          `${f.drill_loop_quiet_max_ms} / ${f.drill_loop_max_ms} ms |`,
      );
    }
    return {
      report: {
        ok: checks.every((c) => c.ok),
        reconciled: 0,
        retried: 0,
        checks,
        writes: {},
      },
      extra: {
        latency_bound: LATENCY_BOUND,
        quiet_window_ms: QUIET_MS,
        warmup_p99_ms: warmup.p99,
        warmup_calls: warmup.calls,
        pinning:
          'server' in pinning
            ? { server_cpus: pinning.server, attacker_cpus: pinning.attackers, server_pid: pid }
            : pinning.none,
        load_average: load,
        cpus: os.availableParallelism(),
        peak_rss_mb: Math.round(peak),
        attacks: figures,
        run: randomBytes(3).toString('hex'),
      },
    };
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
    await bystander?.stop().catch(() => undefined);
    await server?.stop();
    await hostile.stop();
    // The drill's CPUs as they were: another drill may run in this process next.
    if ('server' in pinning) pinTo(process.pid, pinning.before);
  }
}

// The well-behaved agent's own process (Bystander.start): told where to connect, then asked for figures.
if (
  process.argv[2] === 'bystander' &&
  process.argv[1] &&
  fileURLToPath(import.meta.url) === process.argv[1]
) {
  process.once('message', (m: { url: string; token: string }) => {
    void runBystander(m.url, m.token, (reply) => process.send!(reply));
  });
}
