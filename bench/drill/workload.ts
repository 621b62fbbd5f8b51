import { randomBytes } from 'node:crypto';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { connect } from '../lib/server.ts';
import { sleep } from '../lib/stats.ts';
import { ChairSession } from '../lib/web.ts';
import { classifyError, classifyResult, Tally, type Classified } from './outcome.ts';

type Envelope = Record<string, unknown>;

/** An MCP client that talks to one live server at a time and moves to another when its server is gone. */
class Agent {
  private conn?: { url: string; client: Client };
  constructor(
    private readonly pick: () => string | undefined,
    private readonly token: string,
    private readonly tally: Tally,
  ) {}

  private drop(): void {
    const client = this.conn?.client;
    this.conn = undefined;
    void client?.close().catch(() => {});
  }

  async call(name: string, args: Record<string, unknown>): Promise<{ c: Classified; env?: Envelope }> {
    if (!this.conn) {
      const url = this.pick();
      if (!url) return { c: { outcome: 'lost', detail: 'no server up' } };
      try {
        this.conn = { url, client: await connect(url, this.token) };
      } catch (err) {
        const c = classifyError(err);
        this.tally.add(c);
        return { c };
      }
    }
    let c: Classified;
    let env: Envelope | undefined;
    try {
      const result = await this.conn.client.callTool({ name, arguments: args }, undefined, {
        timeout: 20_000,
      });
      c = classifyResult(result);
      env = (result as { structuredContent?: Envelope }).structuredContent;
    } catch (err) {
      c = classifyError(err);
    }
    this.tally.add(c);
    if (c.outcome === 'lost' || c.outcome === 'unstructured') this.drop();
    return { c, env };
  }

  close(): void {
    this.drop();
  }
}

export interface WriteRecord {
  content: string;
  approval_request_id?: string;
  approval_id?: string;
  /** The approval's status once settled: succeeded, failed, unknown — or how far it got. */
  status: string;
  execute_attempts: number;
}

export interface WorkloadOptions {
  /** A live server's URL, or undefined when none is up. */
  pick(): string | undefined;
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
}

export interface Workload {
  tally: Tally;
  writes: WriteRecord[];
  /** Stops issuing new work; resolves once every write in flight has settled or been given up. */
  stop(): Promise<void>;
}

const QUERIES = ['mar', 'alice', 'דוד', '王', 'legal', 'board'];
const SETTLED = new Set(['succeeded', 'failed', 'unknown']);

/** Readers searching the directory and writers sending messages through dry run → approve → execute. */
export function startWorkload(o: WorkloadOptions): Workload {
  const tally = new Tally();
  const writes: WriteRecord[] = [];
  const run = randomBytes(3).toString('hex');
  let stopping = false;
  const stepTimeout = o.stepTimeoutMs ?? 60_000;
  const chair = new ChairSession('');
  let chairReady: Promise<void> | undefined;
  const signIn = () =>
    (chairReady ??= (async () => {
      for (;;) {
        const url = o.pick();
        if (url) {
          chair.base = url;
          try {
            return await chair.login(o.chair.name, o.chair.password);
          } catch {
            // the server went away mid sign-in: try another
          }
        }
        await sleep(200);
      }
    })());

  async function reader(agent: Agent, n: number) {
    await sleep((o.paceMs * n) / Math.max(1, o.readers)); // spread the readers over one interval
    const start = Date.now();
    for (let i = 0; !stopping; i++) {
      await agent.call('isphere_search_contacts', { query: QUERIES[(n + i) % QUERIES.length], limit: 10 });
      await sleep(Math.max(0, start + (i + 1) * o.paceMs - Date.now()));
    }
  }

  /** get_approval until `done` says yes or the step times out; the last envelope's approval. */
  async function statusOf(agent: Agent, id: string): Promise<Record<string, unknown> | undefined> {
    const r = await agent.call('isphere_get_approval', { approval_request_id: id });
    return r.c.outcome === 'ok' ? (r.env!.approval as Record<string, unknown>) : undefined;
  }

  async function write(agent: Agent, w: number, i: number) {
    const content = `drill ${run} writer ${w} message ${i}`;
    const record: WriteRecord = { content, status: 'not drafted', execute_attempts: 0 };
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
        const url = o.pick();
        if (url) {
          chair.base = url;
          await chair.decide(record.approval_request_id).catch(() => undefined);
        }
        continue;
      }
      await sleep(200);
    }
    if (!record.approval_id) return;

    for (const until = deadline(); Date.now() < until;) {
      record.execute_attempts++;
      const r = await agent.call('isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: record.approval_id,
      });
      if (r.c.outcome === 'ok' && r.env!.send_status === 'sent') {
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

  const agents = Array.from({ length: o.readers + o.writers }, () => new Agent(o.pick, o.token, tally));
  const loops = agents.map((a, k) => (k < o.readers ? reader(a, k) : writer(a, k - o.readers)));
  return {
    tally,
    writes,
    async stop() {
      stopping = true;
      await Promise.all(loops);
      for (const a of agents) a.close();
    },
  };
}
