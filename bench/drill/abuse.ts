import { createHmac, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { fetchUnwarned } from '../../src/core/fetch.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { statusMb } from '../lib/proc.ts';
import { callTool, connect, ROOT, spawnCountersign, spawnNode, type Child } from '../lib/server.ts';
import { freePort } from '../lib/supergateway.ts';
import { percentile, round, sleep } from '../lib/stats.ts';
import type { InvariantReport } from './invariants.ts';

/**
 * The abuse drill (`npm run drill -- abuse`): the hostile callers and upstreams of docs/reliability.md,
 * one attack after another against one server, while a well-behaved agent searches the directory ten
 * times a second. Per attack: the requests sent, how they were answered, the audit rows they wrote,
 * the well-behaved agent's p99 during it, and the server's RSS after it. It passes when every attack
 * was refused as designed, the well-behaved p99 stayed within 3× its quiet p99, and the server never
 * went down.
 */

export interface AttackFigures {
  attack: string;
  requests: number;
  /** How the attack's requests were answered: HTTP status or envelope code, and how many of each. */
  answers: Record<string, number>;
  audit_rows: number;
  seconds: number;
  /** The well-behaved agent's latency while the attack ran (ms). */
  good_p99_ms: number | null;
  good_calls: number;
  good_failed: number;
  /**
   * The server's own event-loop delay while the attack ran (prom-client's eventloop lag figures,
   * which restart at each scrape of /metrics): how long the process itself was held, apart from the
   * clients' share of the machine's cores.
   */
  server_loop_p99_ms: number | null;
  server_loop_max_ms: number | null;
  rss_mb: number;
  /** What the attack had to show, and whether it did. */
  expect: string;
  ok: boolean;
}

/** The well-behaved agent: a search every 100 ms, each latency kept under the attack of the moment. */
class Bystander {
  phase = 'quiet';
  private readonly samples = new Map<string, { ms: number[]; failed: number }>();
  private stopped = false;
  private loop?: Promise<void>;
  constructor(private readonly client: Client) {}

  start(): void {
    this.loop = (async () => {
      for (let next = Date.now(); !this.stopped;) {
        const phase = this.phase;
        const t0 = performance.now();
        const ok = await callTool(
          this.client,
          'isphere_search_contacts',
          { query: 'alice', limit: 10 },
          20_000,
        )
          .then((r) => r.envelope.ok === true)
          .catch(() => false);
        const s = this.samples.get(phase) ?? { ms: [], failed: 0 };
        s.ms.push(performance.now() - t0);
        if (!ok) s.failed++;
        this.samples.set(phase, s);
        next += 100;
        await sleep(Math.max(0, next - Date.now()));
      }
    })();
  }

  of(phase: string): { p99: number | null; calls: number; failed: number } {
    const s = this.samples.get(phase);
    if (!s || s.ms.length === 0) return { p99: null, calls: 0, failed: 0 };
    return { p99: round(percentile(s.ms, 99), 1), calls: s.ms.length, failed: s.failed };
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.loop;
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
): Promise<string[]> {
  const labels: string[] = [];
  for (let i = 0; i < total; i += parallel) {
    const batch = Array.from({ length: Math.min(parallel, total - i) }, (_, j) =>
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
  log: (line: string) => void;
  /** The CLI, run against the drill's database. */
  cli: (args: string[]) => Promise<{ code: number; out: string }>;
}

/** The server's event-loop delay since the last scrape of /metrics (ms), read off a scrape. */
async function loopDelay(base: string): Promise<{ p99: number | null; max: number | null }> {
  const text = await fetch(new URL('/metrics', base)).then((r) => r.text());
  const figure = (name: string) => {
    const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
    return m ? round(Number(m[1]) * 1000, 1) : null;
  };
  return { p99: figure('nodejs_eventloop_lag_p99_seconds'), max: figure('nodejs_eventloop_lag_max_seconds') };
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
  // The hostile upstream in a process of its own: its 64 MiB answers cost it, not the drill's clients.
  const hostile = await spawnNode(
    [path.join(ROOT, 'test/helpers/hostile-upstream.ts'), 'http'],
    {},
    /"url":"([^"]+)"/,
  );
  // Niced: on a machine of two cores the attacker's own work (making 64 MiB answers) would otherwise be
  // what the well-behaved agent waits for, where an attacker elsewhere would cost this server nothing.
  os.setPriority(hostile.pid, 19);
  const configFile = path.join(o.dataDir, 'abuse-config.json');
  fs.writeFileSync(configFile, JSON.stringify({ upstreams: [{ name: 'hostile', url: hostile.url }] }));

  // The attackers' agents, and the people whose sign-ins are attacked.
  const seed = await openDatabase({ url: o.dbUrl, pgliteDir: '', command: 'drill seed' });
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
  const clients: Client[] = [];
  try {
    server = await spawnCountersign({ DATABASE_URL: o.dbUrl, COUNTERSIGN_DATA_DIR: o.dataDir, ...env });
    const base = server.url;
    const pid = server.pid;
    const good = await connect(base, o.token);
    clients.push(good);
    const bystander = new Bystander(good);
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
      rss_mb: 0,
      server_loop_p99_ms: null,
      server_loop_max_ms: null,
      expect:
        'every probe answered: refused before it listens, then 503 starting (healthz and MCP alike), then ready; none hung',
      ok: startup.labels.every((l) =>
        ['not listening', 'healthz 503 starting', 'mcp 503 starting', 'healthz 200', 'mcp 401'].some(
          (w) => l === w || l.startsWith(`${w} `),
        ),
      ),
    };
    figures.push(startupFigure);

    bystander.start();
    await sleep(10_000);
    const quiet = bystander.of('quiet');
    o.log(`  quiet: the well-behaved agent's p99 ${quiet.p99} ms over ${quiet.calls} calls`);

    const attack = async (
      name: string,
      expect: string,
      run: () => Promise<string[]>,
      judge: (answers: Record<string, number>) => boolean,
    ) => {
      bystander.phase = name;
      const rows0 = await auditRows(o.dbUrl);
      await loopDelay(base); // restarts the server's event-loop figures
      const t0 = Date.now();
      const labels = await run();
      const seconds = (Date.now() - t0) / 1000;
      // The well-behaved agent a moment longer under the same label, so a short attack has samples too.
      await sleep(2000);
      const answers = tally(labels);
      const seen = bystander.of(name);
      const loop = await loopDelay(base);
      const f: AttackFigures = {
        attack: name,
        requests: labels.length,
        answers,
        audit_rows: (await auditRows(o.dbUrl)) - rows0,
        seconds: round(seconds, 1),
        good_p99_ms: seen.p99,
        good_calls: seen.calls,
        good_failed: seen.failed,
        rss_mb: round(statusMb(pid, 'VmRSS'), 1),
        server_loop_p99_ms: loop.p99,
        server_loop_max_ms: loop.max,
        expect,
        ok: judge(answers),
      };
      figures.push(f);
      o.log(
        `  ${name}: ${f.requests} requests in ${f.seconds} s ${JSON.stringify(answers)}; ${f.audit_rows} audit rows; ` +
          `well-behaved p99 ${f.good_p99_ms} ms (${seen.failed}/${seen.calls} failed); ` +
          `server event loop p99 ${f.server_loop_p99_ms} ms, max ${f.server_loop_max_ms} ms; RSS ${f.rss_mb} MB`,
      );
    };
    const n = (share: number) => Math.max(20, Math.round(o.flood * share));

    await attack(
      'bad bearer tokens',
      'every one 401, the rows bounded (N a minute per address and reason, then one summary)',
      () =>
        burst(o.flood, 20, (i) =>
          fetch(new URL('/mcp', base), {
            method: 'POST',
            headers: {
              authorization: `Bearer cs_not-a-token-${i}`,
              'content-type': 'application/json',
              accept: 'application/json, text/event-stream',
            },
            body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
          }).then(label),
        ),
      (a) => Object.keys(a).every((k) => k.startsWith('401')),
    );

    await attack(
      'unsigned Slack callbacks',
      'every one refused 401, the rows bounded',
      () =>
        burst(n(0.15), 20, (i) => {
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
        }),
      (a) => Object.keys(a).every((k) => k.startsWith('401')),
    );

    await attack(
      'forged single sign-on callbacks',
      'the first 20 refused (400 no_attempt), the rest 429; then the right password still signs in',
      async () => {
        const labels = await burst(n(0.15), 20, (i) =>
          fetch(new URL(`/login/oidc/callback?code=c${i}&state=s${i}`, base), { redirect: 'manual' }).then(
            label,
          ),
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
      async () => {
        const flooder = await connect(base, limited.token);
        clients.push(flooder);
        const long = 'x'.repeat(100_000);
        return burst(n(0.15), 10, async (i) => {
          const r = await flooder
            .callTool({ name: `no_such_tool_${i}_${long}`, arguments: {} }, { timeout: 20_000 })
            .then(
              (res) =>
                (res.structuredContent as { error?: { code?: string } } | undefined)?.error?.code ?? 'ok',
              (err: { data?: { code?: string } }) => err.data?.code ?? 'no code',
            );
          return r;
        });
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
      'catastrophic upstream pattern',
      "each call refused at once (the pattern runs in linear time); the bystander's p99 holds",
      () =>
        burst(20, 4, (i) =>
          callTool(upstreamClient, 'hostile__match', { s: 'a'.repeat(33 + i) + '!' }, 30_000).then(
            (r) =>
              String(
                (r.envelope.error as { code?: string } | undefined)?.code ??
                  (r.envelope.ok ? 'ok' : 'no code'),
              ),
            (err: { data?: { code?: string } }) => err.data?.code ?? 'no code',
          ),
        ),
      (a) => Object.keys(a).every((k) => k === 'INVALID_ARGUMENT'),
    );

    await attack(
      'upstream answers of 64 MiB',
      'each refused CONNECTOR_FAILED (result_too_large, past max_result_bytes = 8 MiB); the server stays up',
      () =>
        burst(6, 2, () =>
          callTool(upstreamClient, 'hostile__big', { bytes: 64 * 1024 * 1024 }, 60_000).then(
            (r) => {
              const e = r.envelope.error as { code?: string; reason?: string } | undefined;
              return e ? `${e.code} ${e.reason ?? ''}`.trim() : 'ok';
            },
            (err: { data?: { code?: string } }) => err.data?.code ?? 'no code',
          ),
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

    await bystander.stop();
    const crashed = server.child.exitCode !== null || server.child.signalCode !== null;
    const peak = statusMb(pid, 'VmHWM');
    for (const f of figures) {
      checks.push({ name: `${f.attack}: ${f.expect}`, ok: f.ok, detail: JSON.stringify(f.answers) });
    }
    const worst = Math.max(...figures.map((f) => f.good_p99_ms ?? 0));
    const bound = 3 * (quiet.p99 ?? Number.POSITIVE_INFINITY);
    checks.push({
      name: "the well-behaved agent's p99 within 3× its quiet p99 during every attack",
      ok: worst <= bound,
      detail: `quiet ${quiet.p99} ms; worst ${worst} ms (${figures
        .filter((f) => f.good_p99_ms !== null)
        .map((f) => `${f.attack}: ${f.good_p99_ms}`)
        .join(', ')})`,
    });
    checks.push({
      name: 'the server never went down',
      ok: !crashed,
      detail: `peak RSS ${Math.round(peak)} MB`,
    });
    return {
      report: {
        ok: checks.every((c) => c.ok),
        reconciled: 0,
        retried: 0,
        checks,
        writes: {},
      },
      extra: {
        quiet_p99_ms: quiet.p99,
        quiet_calls: quiet.calls,
        peak_rss_mb: Math.round(peak),
        attacks: figures,
        run: randomBytes(3).toString('hex'),
      },
    };
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
    await server?.stop();
    await hostile.stop();
  }
}
