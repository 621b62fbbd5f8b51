import { performance } from 'node:perf_hooks';
import client from 'prom-client';

/** How a statement is counted: transaction control apart, since a commit waits for the disk. */
type StatementKind = 'begin' | 'commit' | 'rollback' | 'statement';

const kindOf = (sql: unknown): StatementKind => {
  const head = typeof sql === 'string' ? sql.trimStart().slice(0, 8).toLowerCase() : '';
  if (head.startsWith('begin')) return 'begin';
  if (head.startsWith('commit')) return 'commit';
  if (head.startsWith('rollback')) return 'rollback';
  return 'statement';
};

interface KnexEvent {
  __knexUid?: string;
  sql?: unknown;
}

/**
 * What `watch` reads of the database handle (a knex instance): its query events and its client's pool.
 * Said by shape, so that the MCP server's folder needs no database import (the floors' lint).
 */
interface StatementEvents {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- EventEmitter's own listener type, as knex declares it
  on(event: string, f: (...args: any[]) => void): unknown;
  client: unknown;
}

/** The events of knex's pool (tarn) read here. */
interface TarnEvents {
  on?(event: 'release', f: (connection: KnexEvent) => void): void;
  on?(event: 'destroySuccess', f: (id: unknown, connection: KnexEvent) => void): void;
}

/**
 * Where the server waits rather than computes (docs/performance.md, "Where one call waits"): each
 * database statement from its sending to its answer, by kind; each upstream request to its answer; and
 * the main thread's event loop busy and idle. `npm run bench -- --only j` reads them from /metrics
 * around a run of calls of one kind and divides by the calls.
 *
 * A statement's end is its `query-response` or `query-error` (knex emits them for the statements it
 * builds), or else — for BEGIN, COMMIT and ROLLBACK, which knex sends without either — the next
 * statement on the same connection or the connection's return to the pool, whichever comes first.
 * Statements on different connections overlap, so the sum can exceed the wall time of concurrent calls.
 */
export function createWaitAccount(registry: client.Registry) {
  const dbSeconds = new client.Counter({
    name: 'countersign_db_wait_seconds_total',
    help: 'Time from sending each database statement to its answer, summed, by kind (begin, commit, rollback, statement)',
    labelNames: ['kind'],
    registers: [registry],
  });
  const dbAnswers = new client.Counter({
    name: 'countersign_db_answers_total',
    help: 'Database statements answered (those of countersign_db_wait_seconds_total), by kind',
    labelNames: ['kind'],
    registers: [registry],
  });
  const upstreamSeconds = new client.Counter({
    name: 'countersign_upstream_wait_seconds_total',
    help: 'Time from sending each upstream tools/call to its answer or failure, summed',
    registers: [registry],
  });
  const upstreamCalls = new client.Counter({
    name: 'countersign_upstream_calls_total',
    help: 'Upstream tools/call requests answered or failed',
    registers: [registry],
  });
  // Read at each scrape: the main thread's event loop since the process started (Node's own account:
  // idle is the time spent waiting for I/O or a timer, active everything else).
  new client.Gauge({
    name: 'countersign_event_loop_active_seconds',
    help: "Time the main thread's event loop spent running callbacks since the start",
    registers: [registry],
    collect() {
      this.set(performance.eventLoopUtilization().active / 1000);
    },
  });
  new client.Gauge({
    name: 'countersign_event_loop_idle_seconds',
    help: "Time the main thread's event loop spent waiting for I/O or timers since the start",
    registers: [registry],
    collect() {
      this.set(performance.eventLoopUtilization().idle / 1000);
    },
  });

  return {
    /** Times every statement `knex` sends (its query events and its pool's releases). */
    watch(knex: StatementEvents) {
      const open = new Map<string, { at: number; kind: StatementKind }>();
      const end = (uid: string | undefined) => {
        const o = uid === undefined ? undefined : open.get(uid);
        if (!o) return;
        open.delete(uid!);
        dbSeconds.inc({ kind: o.kind }, (performance.now() - o.at) / 1000);
        dbAnswers.inc({ kind: o.kind });
      };
      knex.on('query', (q: KnexEvent) => {
        if (q.__knexUid === undefined) return;
        end(q.__knexUid);
        open.set(q.__knexUid, { at: performance.now(), kind: kindOf(q.sql) });
      });
      knex.on('query-response', (_r: unknown, q: KnexEvent) => end(q.__knexUid));
      knex.on('query-error', (_e: unknown, q: KnexEvent) => end(q.__knexUid));
      // A pool (knex's tarn pool on PostgreSQL); PGlite's single connection may have none. A
      // connection destroyed mid-statement ends its entry too, so none is kept for a connection gone.
      const pool = (knex.client as { pool?: TarnEvents }).pool;
      pool?.on?.('release', (c: KnexEvent) => end(c.__knexUid));
      pool?.on?.('destroySuccess', (_id: unknown, c: KnexEvent) => end(c?.__knexUid));
    },
    /** `call` timed from its start to its answer or failure. */
    upstream<A extends unknown[], R>(call: (...args: A) => Promise<R>): (...args: A) => Promise<R> {
      return async (...args) => {
        const at = performance.now();
        try {
          return await call(...args);
        } finally {
          upstreamSeconds.inc((performance.now() - at) / 1000);
          upstreamCalls.inc();
        }
      };
    },
  };
}
export type WaitAccount = ReturnType<typeof createWaitAccount>;
