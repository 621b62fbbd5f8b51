import { fsUpstream, ONE_KIB } from '../lib/fs-upstream.ts';
import { cpuSeconds } from '../lib/proc.ts';
import { figure, type Figure } from '../lib/report.ts';
import { callTool, connect, spawnCountersign, untilAnswered } from '../lib/server.ts';
import { ChairSession } from '../lib/web.ts';

export interface WaitOptions {
  url: string;
  dataDir: string;
  token: string;
  chair: { name: string; password: string };
  /** Sequential calls per step. */
  calls: number;
  log(line: string): void;
}

/** The server's counters that say where a call waited (src/server/waits.ts), read from /metrics. */
interface Reading {
  at: number;
  cpu: number;
  loopActive: number;
  loopIdle: number;
  db: Record<'begin' | 'commit' | 'rollback' | 'statement', { n: number; s: number }>;
  upstream: { n: number; s: number };
}

const KINDS = ['begin', 'statement', 'commit', 'rollback'] as const;

function series(text: string, name: string, kind?: string): number {
  const label = kind ? `\\{kind="${kind}"\\}` : '';
  const m = new RegExp(`^${name}${label} ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

async function read(url: string, pid: number): Promise<Reading> {
  const text = await (await fetch(new URL('/metrics', url))).text();
  const db = Object.fromEntries(
    KINDS.map((k) => [
      k,
      {
        n: series(text, 'countersign_db_answers_total', k),
        s: series(text, 'countersign_db_wait_seconds_total', k),
      },
    ]),
  ) as Reading['db'];
  return {
    at: performance.now(),
    cpu: cpuSeconds(pid),
    loopActive: series(text, 'countersign_event_loop_active_seconds'),
    loopIdle: series(text, 'countersign_event_loop_idle_seconds'),
    db,
    upstream: {
      n: series(text, 'countersign_upstream_calls_total'),
      s: series(text, 'countersign_upstream_wait_seconds_total'),
    },
  };
}

/** Per call, between two readings: milliseconds, and counts. */
interface Account {
  wall: number;
  cpu: number;
  active: number;
  idle: number;
  /** Statements other than transaction control, and their wait. */
  statements: number;
  statementMs: number;
  /** BEGIN and ROLLBACK. */
  control: number;
  controlMs: number;
  /** COMMIT apart: it waits for the WAL to reach the disk. */
  commits: number;
  commitMs: number;
  upstreams: number;
  upstreamMs: number;
}

function account(a: Reading, b: Reading, calls: number): Account {
  const n = (k: (typeof KINDS)[number]) => (b.db[k].n - a.db[k].n) / calls;
  const ms = (s: number) => (s * 1000) / calls;
  const kms = (k: (typeof KINDS)[number]) => ms(b.db[k].s - a.db[k].s);
  return {
    wall: (b.at - a.at) / calls,
    cpu: ms(b.cpu - a.cpu),
    active: ms(b.loopActive - a.loopActive),
    idle: ms(b.loopIdle - a.loopIdle),
    statements: n('statement'),
    statementMs: kms('statement'),
    control: n('begin') + n('rollback'),
    controlMs: kms('begin') + kms('rollback'),
    commits: n('commit'),
    commitMs: kms('commit'),
    upstreams: (b.upstream.n - a.upstream.n) / calls,
    upstreamMs: ms(b.upstream.s - a.upstream.s),
  };
}

const f = (x: number, digits = 2) => x.toFixed(digits);
/** The account in words: each wait, its count, its time per call. */
const described = (x: Account) =>
  `server CPU ${f(x.cpu)} ms (event loop busy ${f(x.active)}, idle ${f(x.idle)}); database: ` +
  `${f(x.statements, 1)} statements ${f(x.statementMs)} ms, ${f(x.control, 1)} begin/rollback ` +
  `${f(x.controlMs)} ms, ${f(x.commits, 1)} commits ${f(x.commitMs)} ms; upstream ${f(x.upstreams, 1)} ` +
  `requests ${f(x.upstreamMs)} ms; rest ${f(x.wall - x.cpu - x.statementMs - x.controlMs - x.commitMs - x.upstreamMs)} ms`;

/**
 * (j) where one sequential call waits: for a built-in read, a proxied read (the 1 KiB file of (h)) and
 * each step of the approval cycle of (e), `calls` calls of the kind one after another, the server's
 * counters read before and after (src/server/waits.ts) and divided by the calls. Beside each: the wall
 * time seen by the client and the server's CPU time (/proc, in 10 ms ticks: a run of 200 calls reads
 * to 0.05 ms a call). "rest" is what none of them covers: the client's own time, the HTTP exchange and
 * the kernel between the processes, and waits the counters do not see.
 */
export async function waitFigures(o: WaitOptions): Promise<Figure[]> {
  const ws = fsUpstream('waits');
  const server = await spawnCountersign({
    DATABASE_URL: o.url,
    COUNTERSIGN_DATA_DIR: o.dataDir,
    COUNTERSIGN_CONFIG: ws.config,
  });
  try {
    const agent = await connect(server.url, o.token);
    const chair = new ChairSession(server.url);
    await chair.login(o.chair.name, o.chair.password);
    const proxied = `${ws.name}__read_text_file`;
    const readProxied = async () => {
      const { envelope } = await callTool(agent, proxied, { path: ws.file });
      const text = (envelope.content as { text?: string }[] | undefined)?.[0]?.text;
      return envelope.ok === true && text === ONE_KIB ? undefined : JSON.stringify(envelope).slice(0, 300);
    };
    await untilAnswered('countersign', readProxied);
    const readBuiltin = async () => {
      const { envelope } = await callTool(agent, 'isphere_search_contacts', { query: 'mar', limit: 10 });
      if (envelope.ok !== true) throw new Error(`search failed: ${JSON.stringify(envelope.error)}`);
    };

    let n = 0;
    const draft = async () => {
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: `Wait account ${n++}` };
      const { envelope } = await callTool(agent, 'isphere_send_message', args);
      const request = (envelope.approval as { approval_request_id?: string } | undefined)
        ?.approval_request_id;
      if (!request) throw new Error(`dry run failed: ${JSON.stringify(envelope.error ?? envelope)}`);
      return { args, request };
    };
    const getApproval = async (request: string) => {
      const { envelope } = await callTool(agent, 'isphere_get_approval', { approval_request_id: request });
      const id = (envelope.approval as { approval_id?: string | null } | undefined)?.approval_id;
      if (!id) throw new Error(`no approval_id: ${JSON.stringify(envelope)}`);
      return id;
    };
    const execute = async (args: Record<string, unknown>, approvalId: string) => {
      const { envelope } = await callTool(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      if (envelope.send_status !== 'sent') throw new Error(`execution failed: ${JSON.stringify(envelope)}`);
    };

    // Warm-up: every kind of call a few times (JIT, pools, the upstream's own start).
    for (let i = 0; i < 10; i++) {
      await readBuiltin();
      await readProxied();
      const d = await draft();
      await chair.approve(d.request);
      await execute(d.args, await getApproval(d.request));
    }

    /** `run` for each of `items`, one after another, between two readings of the server's counters. */
    const measure = async <T>(items: T[], run: (item: T) => Promise<unknown>) => {
      const before = await read(server.url, server.pid);
      for (const item of items) await run(item);
      return account(before, await read(server.url, server.pid), items.length);
    };
    const calls = Array.from({ length: o.calls }, (_, i) => i);
    const results: [string, Account][] = [];
    results.push(['read', await measure(calls, readBuiltin)]);
    results.push(['proxied read', await measure(calls, readProxied)]);
    const drafts: { args: Record<string, unknown>; request: string }[] = [];
    results.push(['dry run', await measure(calls, async () => drafts.push(await draft()))]);
    results.push(['approve', await measure(drafts, (d) => chair.approve(d.request))]);
    const approved: string[] = [];
    results.push([
      'get_approval',
      await measure(drafts, async (d) => approved.push(await getApproval(d.request))),
    ]);
    const executions = drafts.map((d, i) => ({ args: d.args, approvalId: approved[i]! }));
    results.push(['execute', await measure(executions, (e) => execute(e.args, e.approvalId))]);
    await agent.close();

    o.log(`  ${o.calls} sequential calls of each kind, per call (PostgreSQL):`);
    for (const [name, x] of results)
      o.log(`  ${name.padEnd(13)} ${f(x.wall).padStart(6)} ms: ${described(x)}`);
    return results.map(([name, x]) =>
      figure({
        id: `j_wait_${name.replace(/ /g, '_')}_ms`,
        unit: 'ms',
        value: x.wall,
        check: null,
        note: described(x),
      }),
    );
  } finally {
    await server.stop();
    ws.dispose();
  }
}
