import { randomBytes } from 'node:crypto';
import { Client, SdkError, SdkErrorCode, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { sleep } from '../lib/stats.ts';
import { ChairSession } from '../lib/web.ts';
import { BAD_GATEWAY_CODE } from './balancer.ts';
import { classifyError, classifyResult, Tally, type Classified } from './outcome.ts';

type Envelope = Record<string, unknown>;

/** The protocol revisions the workload's clients speak: the v2 client's default handshake, and the pin. */
export const REVISIONS = ['2025', '2026-07-28'] as const;
export type Revision = (typeof REVISIONS)[number];

/**
 * A fetch whose SSE answers report a connection cut mid-stream. A 2025-mode client reads a tools/call
 * answer as an SSE stream; the server sends no event ids, so when the stream is cut the SDK has nothing
 * to resume from and only reports the error to `onerror`, leaving the call pending until its timeout.
 * An agent's HTTP client knows at once that the connection is gone: so does this one.
 */
function reportingCuts(onCut: (err: unknown) => void): typeof fetch {
  return async (input, init) => {
    const res = await fetch(input, init);
    if (!res.body || !res.headers.get('content-type')?.startsWith('text/event-stream')) return res;
    const reader = res.body.getReader();
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        try {
          const { done, value } = await reader.read();
          if (done) controller.close();
          else controller.enqueue(value);
        } catch (err) {
          onCut(err);
          controller.error(err);
        }
      },
      cancel: (reason) => reader.cancel(reason),
    });
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

/**
 * An MCP client of one endpoint (a balancer in front of the replicas, or one server). The endpoint is
 * stateless: the client connects once (the 2025 handshake, or server/discover when pinned to
 * 2026-07-28) and keeps going whichever replica answers, and whichever dies; it reconnects only when the
 * handshake itself got no answer, or after an unstructured one.
 */
class Agent {
  private client?: Client;
  /** The call in flight (one at a time), aborted when its answer stream is cut. */
  private inflight?: AbortController;
  constructor(
    private readonly url: string,
    private readonly token: string,
    readonly revision: Revision,
    private readonly tallies: Tally[],
  ) {}

  private count(c: Classified): Classified {
    for (const t of this.tallies) t.add(c);
    return c;
  }

  private async connect(): Promise<Client> {
    const client = new Client(
      { name: 'countersign-drill', version: '1.0.0' },
      this.revision === '2025' ? undefined : { versionNegotiation: { mode: { pin: this.revision } } },
    );
    client.onerror = () => {}; // cut streams are reported through the call they belong to
    const onCut = (err: unknown) =>
      this.inflight?.abort(new SdkError(SdkErrorCode.ConnectionClosed, `answer stream cut: ${String(err)}`));
    await client.connect(
      new StreamableHTTPClientTransport(new URL('/mcp', this.url), {
        fetch: reportingCuts(onCut),
        requestInit: { headers: { Authorization: `Bearer ${this.token}` } },
      }),
    );
    return client;
  }

  private drop(): void {
    const client = this.client;
    this.client = undefined;
    void client?.close().catch(() => {});
  }

  async call(name: string, args: Record<string, unknown>): Promise<{ c: Classified; env?: Envelope }> {
    try {
      this.client ??= await this.connect();
    } catch (err) {
      return { c: this.count(classifyError(err)) };
    }
    let c: Classified;
    let env: Envelope | undefined;
    this.inflight = new AbortController();
    try {
      const result = await this.client.callTool(
        { name, arguments: args },
        { timeout: 20_000, signal: this.inflight.signal },
      );
      c = classifyResult(result);
      env = (result as { structuredContent?: Envelope }).structuredContent;
    } catch (err) {
      c = classifyError(err);
    } finally {
      this.inflight = undefined;
    }
    this.count(c);
    if (c.outcome === 'unstructured') this.drop();
    return { c, env };
  }

  close(): void {
    this.drop();
  }
}

export interface WriteRecord {
  content: string;
  /** The protocol revision its writer speaks. */
  revision: Revision;
  approval_request_id?: string;
  approval_id?: string;
  /** The approval's status once settled: succeeded, failed, unknown — or how far it got. */
  status: string;
  execute_attempts: number;
  /** How each execution request ended: ok, lost, or the refusal's code (e.g. APPROVAL_CONSUMED). */
  executions: string[];
  /** Execution requests answered `sent`: never more than one, however many raced. */
  sent_answers: number;
  /** Whether its first execution was sent by several clients at once. */
  raced: boolean;
  /** How many clients sent its first execution (1, or the racers). */
  first_round: number;
  /**
   * The trace ids of its executions answered "not completed" (-32003 SOURCE_UNAVAILABLE): none of them
   * may have committed a write.started (checkInvariants).
   */
  not_completed: string[];
}

/** How a task-augmented call was answered (the Tasks extension allows a task, or an error; on 2026-07-28 an immediate result too). */
export type TaskAnswer = 'task' | 'error' | 'immediate' | 'problem' | 'lost' | 'unreadable';

export interface TaskCallRecord {
  revision: '2025-11-25' | '2026-07-28';
  /** A draft the server refuses (an unknown target), or one it drafts as a task. */
  refused: boolean;
  answer: TaskAnswer;
  detail?: string;
}

export interface WorkloadOptions {
  /** Where every client and the chair's browser go: the balancer's URL, or one server's. */
  url: string;
  token: string;
  chair: { name: string; password: string };
  readers: number;
  writers: number;
  /** A reader starts a call every this many ms (at once when it is behind). */
  paceMs: number;
  /** A writer's pause between two writes (default paceMs). */
  writerPauseMs?: number;
  /** Give up on one step of a write after this long (a settled status is still looked for). */
  stepTimeoutMs?: number;
  /** Readers of a proxied upstream tool besides the built-in ones (the soak drives both paths). */
  proxied?: ProxiedReads;
  /** Every `every`-th write's first execution is sent by `racers` clients at once, each its own session. */
  race?: { every: number; racers: number };
  /** Clients asking writes as tasks (both revisions in turn), half of them drafts the server refuses. */
  tasks?: { askers: number; paceMs: number };
}

/** Readers calling one upstream tool through countersign's proxy, each at its own pace. */
export interface ProxiedReads {
  readers: number;
  paceMs: number;
  /** The exposed name, `<upstream>__<tool>`. */
  tool: string;
  args: Record<string, unknown>;
}

/** The two read paths: countersign's own tools, and upstream tools it proxies. */
export type ReadPath = 'builtin' | 'proxied';

export interface Workload {
  tally: Tally;
  /** The same requests, by the protocol revision of the client that sent them. */
  byRevision: Record<Revision, Tally>;
  /** The read requests by path (writes are in neither). */
  byPath: Record<ReadPath, Tally>;
  writes: WriteRecord[];
  /** The task-augmented calls and how each was answered. */
  taskCalls: TaskCallRecord[];
  /** Stops issuing new work; resolves once every write in flight has settled or been given up. */
  stop(): Promise<void>;
}

const QUERIES = ['mar', 'alice', 'דוד', '王', 'legal', 'board'];
const SETTLED = new Set(['succeeded', 'failed', 'unknown']);

/**
 * Readers searching the directory (and, given `proxied`, readers of an upstream tool through the proxy)
 * and writers sending messages through dry run → approve (the chair, on the review form) → execute, all
 * at one URL; half the clients of each kind speak the 2025 handshake, half are pinned to 2026-07-28.
 */
export function startWorkload(o: WorkloadOptions): Workload {
  const tally = new Tally();
  const writes: WriteRecord[] = [];
  const run = randomBytes(3).toString('hex');
  let stopping = false;
  const stepTimeout = o.stepTimeoutMs ?? 60_000;
  // The chair's browser: its session lives in the database, so whichever replica answers takes its cookie.
  const chair = new ChairSession(o.url);
  let chairReady: Promise<void> | undefined;
  const signIn = () =>
    (chairReady ??= (async () => {
      for (;;) {
        try {
          return await chair.login(o.chair.name, o.chair.password);
        } catch {
          await sleep(200); // the replica went away mid sign-in: again
        }
      }
    })());

  /** Reader `n` of `of`, calling `next(i)` every `paceMs`. */
  async function reader(
    agent: Agent,
    n: number,
    of: { readers: number; paceMs: number },
    next: (i: number) => [string, Record<string, unknown>],
  ) {
    await sleep((of.paceMs * n) / Math.max(1, of.readers)); // spread the readers over one interval
    const start = Date.now();
    for (let i = 0; !stopping; i++) {
      await agent.call(...next(i));
      await sleep(Math.max(0, start + (i + 1) * of.paceMs - Date.now()));
    }
  }
  const search = (n: number) => (i: number) =>
    ['isphere_search_contacts', { query: QUERIES[(n + i) % QUERIES.length], limit: 10 }] as [
      string,
      Record<string, unknown>,
    ];

  /** get_approval until `done` says yes or the step times out; the last envelope's approval. */
  async function statusOf(agent: Agent, id: string): Promise<Record<string, unknown> | undefined> {
    const r = await agent.call('isphere_get_approval', { approval_request_id: id });
    return r.c.outcome === 'ok' ? (r.env!.approval as Record<string, unknown>) : undefined;
  }

  async function write(agent: Agent, w: number, i: number) {
    const content = `drill ${run} writer ${w} message ${i}`;
    const race = o.race && i % o.race.every === 0 ? racersOf(w, agent.revision) : undefined;
    const record: WriteRecord = {
      content,
      revision: agent.revision,
      status: 'not drafted',
      execute_attempts: 0,
      executions: [],
      sent_answers: 0,
      raced: race !== undefined,
      first_round: race?.length ?? 1,
      not_completed: [],
    };
    writes.push(record);
    const args = { target_type: 'contact', target_id: 'ct_david', content_text: content };
    const deadline = () => Date.now() + stepTimeout;

    for (const until = deadline(); !record.approval_request_id && Date.now() < until;) {
      const r = await agent.call('isphere_send_message', args);
      if (r.c.outcome === 'ok') {
        record.approval_request_id = (r.env!.approval as { approval_request_id: string }).approval_request_id;
        record.status = 'pending';
      } else await sleep(200);
    }
    if (!record.approval_request_id) return;

    await signIn();
    for (const until = deadline(); !record.approval_id && Date.now() < until;) {
      const approval = await statusOf(agent, record.approval_request_id);
      if (approval?.status === 'approved') {
        record.approval_id = String(approval.approval_id);
        record.status = 'approved';
        break;
      }
      if (approval?.status === 'pending') {
        await chair.decide(record.approval_request_id).catch(() => undefined);
        continue;
      }
      await sleep(200);
    }
    if (!record.approval_id) return;

    const execute = { ...args, dry_run: false, approval_id: record.approval_id };
    for (let round = 0, until = deadline(); Date.now() < until; round++) {
      // The first round of a raced write: every racer at once; after that, the writer alone.
      const callers = race && round === 0 ? race : [agent];
      record.execute_attempts += callers.length;
      const answers = await Promise.all(callers.map((a) => a.call('isphere_send_message', execute)));
      let sent = false;
      for (const r of answers) {
        record.executions.push(r.c.code ?? r.c.outcome);
        if (r.c.outcome === 'protocol' && r.c.code === 'SOURCE_UNAVAILABLE' && r.c.trace_id)
          record.not_completed.push(r.c.trace_id);
        if (r.c.outcome === 'ok' && r.env!.send_status === 'sent') {
          record.sent_answers++;
          sent = true;
        }
      }
      if (sent) {
        record.status = 'succeeded';
        return;
      }
      // No answer, or a refusal: the approval's own status says whether the write happened.
      for (;;) {
        const approval = await statusOf(agent, record.approval_request_id);
        const status = approval ? String(approval.status) : undefined;
        if (status) record.status = status;
        if (status && SETTLED.has(status)) return;
        if (status === 'approved' || Date.now() >= until) break; // not executed yet: execute again
        await sleep(300); // executing: left to the connector or to reconciliation
      }
    }
  }

  async function writer(agent: Agent, w: number) {
    for (let i = 0; !stopping; i++) {
      await write(agent, w, i);
      await sleep(o.writerPauseMs ?? o.paceMs);
    }
  }

  // Readers, then writers; within each, every other client pinned to 2026-07-28.
  const byRevision = { '2025': new Tally(), '2026-07-28': new Tally() } satisfies Record<Revision, Tally>;
  const byPath = { builtin: new Tally(), proxied: new Tally() } satisfies Record<ReadPath, Tally>;
  const agent = (n: number, path?: ReadPath) => {
    const revision = REVISIONS[n % 2]!;
    return new Agent(o.url, o.token, revision, [
      tally,
      byRevision[revision],
      ...(path ? [byPath[path]] : []),
    ]);
  };
  const readers = Array.from({ length: o.readers }, (_, n) => agent(n, 'builtin'));
  const proxied = o.proxied;
  const proxiedReaders = Array.from({ length: proxied?.readers ?? 0 }, (_, n) => agent(n, 'proxied'));
  const writers = Array.from({ length: o.writers }, (_, n) => agent(n));
  // Each writer's racers speak its revision; made when first needed.
  const racers = new Map<number, Agent[]>();
  function racersOf(w: number, revision: Revision): Agent[] {
    let set = racers.get(w);
    if (!set) {
      set = Array.from(
        { length: o.race!.racers },
        () => new Agent(o.url, o.token, revision, [tally, byRevision[revision]]),
      );
      racers.set(w, set);
    }
    return set;
  }
  const agents = [...readers, ...proxiedReaders, ...writers];
  const taskCalls: TaskCallRecord[] = [];
  const asker = async (n: number) => {
    for (let i = 0; !stopping; i++) {
      const revision = (n + i) % 2 === 0 ? '2025-11-25' : '2026-07-28';
      const refused = i % 2 === 0;
      const content = `drill ${run} task ${n} ${i}`;
      taskCalls.push({ revision, refused, ...(await askAsTask(o.url, o.token, revision, content, refused)) });
      await sleep(o.tasks!.paceMs);
    }
  };
  const loops = [
    ...Array.from({ length: o.tasks?.askers ?? 0 }, (_, n) => asker(n)),
    ...readers.map((a, n) => reader(a, n, o, search(n))),
    ...proxiedReaders.map((a, n) => reader(a, n, proxied!, () => [proxied!.tool, proxied!.args])),
    ...writers.map((a, n) => writer(a, n)),
  ];
  return {
    tally,
    byRevision,
    byPath,
    writes,
    taskCalls,
    async stop() {
      stopping = true;
      await Promise.all(loops);
      for (const a of [...agents, ...[...racers.values()].flat()]) a.close();
    },
  };
}

/**
 * One write asked as a task, as a requester sends it: on 2025-11-25 a tools/call with a `task`
 * parameter, on 2026-07-28 with the Tasks extension in the request's envelope; `refused` names a target
 * that does not exist. How it was answered: a task, a JSON-RPC error with a code, an immediate result
 * (2026-07-28 only: the extension allows it), an HTTP problem, no answer, or something a requester
 * cannot read.
 */
async function askAsTask(
  url: string,
  token: string,
  revision: TaskCallRecord['revision'],
  content_text: string,
  refused: boolean,
): Promise<{ answer: TaskAnswer; detail?: string }> {
  const args = {
    target_type: 'contact',
    target_id: refused ? 'ct_nobody_at_all' : 'ct_david',
    content_text,
    dry_run: false,
  };
  const modern = revision === '2026-07-28';
  const params = modern
    ? {
        name: 'isphere_send_message',
        arguments: args,
        _meta: {
          'io.modelcontextprotocol/protocolVersion': revision,
          'io.modelcontextprotocol/clientInfo': { name: 'countersign-drill', version: '1.0.0' },
          'io.modelcontextprotocol/clientCapabilities': {
            extensions: { 'io.modelcontextprotocol/tasks': {} },
          },
        },
      }
    : { name: 'isphere_send_message', arguments: args, task: { ttl: 60_000 } };
  let res: Response;
  let text: string;
  try {
    res = await fetch(new URL('/mcp', url), {
      method: 'POST',
      headers: {
        Authorization: `Bearer ${token}`,
        'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream',
        'MCP-Protocol-Version': revision,
        ...(modern ? { 'Mcp-Method': 'tools/call', 'Mcp-Name': 'isphere_send_message' } : {}),
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params }),
      signal: AbortSignal.timeout(30_000),
    });
    text = await res.text();
  } catch (err) {
    return { answer: 'lost', detail: String(err).slice(0, 120) };
  }
  return classifyTaskAnswer(res.status, text, modern);
}

function classifyTaskAnswer(
  status: number,
  text: string,
  modern: boolean,
): { answer: TaskAnswer; detail?: string } {
  const detail = `${status} ${text.slice(0, 160)}`;
  let body: Record<string, unknown>;
  try {
    const data = text.trimStart().startsWith('{')
      ? text
      : text
          .split('\n')
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).trim())
          .filter((l) => l.length > 0)
          .at(-1)!;
    body = JSON.parse(data) as Record<string, unknown>;
  } catch {
    return { answer: status === 200 ? 'unreadable' : 'lost', detail };
  }
  if (status !== 200) {
    if (typeof body.code === 'string')
      return {
        answer: body.code === BAD_GATEWAY_CODE || body.reason === BAD_GATEWAY_CODE ? 'lost' : 'problem',
      };
    return { answer: 'unreadable', detail };
  }
  const error = body.error as { data?: { code?: unknown } } | undefined;
  if (error)
    return typeof error.data?.code === 'string' ? { answer: 'error' } : { answer: 'unreadable', detail };
  const result = body.result as Record<string, unknown> | undefined;
  if (!modern)
    return (result?.task as { taskId?: unknown } | undefined)?.taskId
      ? { answer: 'task' }
      : { answer: 'unreadable', detail };
  if (result?.resultType === 'task') return { answer: 'task' };
  const env = result?.structuredContent as { ok?: unknown } | undefined;
  return typeof env?.ok === 'boolean' ? { answer: 'immediate' } : { answer: 'unreadable', detail };
}
