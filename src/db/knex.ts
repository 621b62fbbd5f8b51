import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { PGlite } from '@electric-sql/pglite';
import knexFactory, { type Knex } from 'knex';
import pg from 'pg';
import type { Logger } from '../log.ts';
import { lockDataDir, type DirLock } from './lock.ts';
import { findTemplate, openPglite, pgliteConnection } from './template.ts';

// bigint (seq) and numeric as JS numbers: every value we store fits in 2^53.
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => Number(v));

export type Dialect = 'pglite' | 'postgres';

/**
 * A connection or an open transaction: what a store's statement runs on. Rule files hand it on to a
 * store (and open transactions with db/retry.ts); only stores and db/ build statements on it.
 */
export type Queryable = Knex | Knex.Transaction;
/** The pool a transaction is opened on (db/retry.ts). */
export type Connection = Knex;
/** An open transaction, for a store function that must run inside one (a row it locks). */
export type Transaction = Knex.Transaction;

export interface Database {
  knex: Knex;
  dialect: Dialect;
  close(): Promise<void>;
}

export interface DatabaseOptions {
  /** postgres:// URL; without it the embedded PGlite in `pgliteDir` is used. */
  url?: string;
  pgliteDir: string;
  /** What this process is doing, written into the lock so a refused process can say who holds it. */
  command: string;
  poolMax?: number;
  /** Where knex's own warnings go (one line each); without it they are dropped, never printed. */
  log?: Logger;
}

/**
 * knex writes its warnings with console.log by default, a failed connection's with its stack: to
 * stdout, the MCP channel of a stdio server; on a terminal, a stack in front of the command's one-line
 * error. Each goes to the log (stderr) as one line instead; the failure itself is thrown.
 */
function knexLog(log: Logger | undefined): Knex.Config['log'] {
  const line = (message: unknown) => String(message).split('\n')[0]!.slice(0, 300);
  return {
    // A failed connection is reported by whatever was waiting for it: here, only for debugging.
    warn: (message: unknown) =>
      /^Acquire connection error/.test(String(message))
        ? log?.debug({ knex: line(message) }, 'database connection failed')
        : log?.warn({ knex: line(message) }, 'database warning'),
    error: (message: unknown) => log?.error({ knex: line(message) }, 'database error'),
    deprecate: (method: unknown, alternative: unknown) =>
      log?.warn({ knex: `${String(method)} is deprecated; use ${String(alternative)}` }, 'database warning'),
    debug: (message: unknown) => log?.debug({ knex: line(message) }, 'database debug'),
  };
}

/** How often the PostgreSQL pool closes connections idle longer than tarn's 30 s (so: after 30–40 s). */
const POOL_REAP_MS = 10_000;

/** Opens PostgreSQL when a URL is given, else the embedded PGlite database (locked to this process). */
export async function openDatabase(opts: DatabaseOptions): Promise<Database> {
  if (opts.url) {
    const knex = knexFactory({
      client: 'pg',
      connection: opts.url,
      // The pool looks for idle connections to close every 10 s rather than tarn's every second: while a
      // connection is pooled (an idle server's few statements keep one), that look is a wake-up of its own.
      pool: { min: 0, max: opts.poolMax ?? 10, reapIntervalMillis: POOL_REAP_MS },
      acquireConnectionTimeout: 10_000,
      log: knexLog(opts.log),
    });
    try {
      await knex.raw('select 1');
    } catch (err) {
      // The pool's sockets and timers would otherwise outlive the refusal (and keep a process alive).
      await knex.destroy().catch(() => {});
      throw err;
    }
    return { knex, dialect: 'postgres', close: () => knex.destroy() };
  }

  const lock: DirLock = lockDataDir(opts.pgliteDir, opts.command, (holder) =>
    opts.log?.warn(
      { stale_lock: holder },
      `cleared a stale lock on ${opts.pgliteDir}: its process ${holder.pid} is gone`,
    ),
  );
  let pglite: PGlite | undefined;
  try {
    const fresh = !fs.existsSync(path.join(opts.pgliteDir, 'PG_VERSION'));
    closedToOthers(opts.pgliteDir);
    // Loaded only here: PGlite's module alone adds tens of MB to a process that talks to PostgreSQL.
    const { default: ClientPgLite } = await import('knex-pglite');
    // A fresh data directory is loaded from the build's template when there is one (src/db/template.ts).
    const template = fresh ? await findTemplate() : undefined;
    pglite = await openPglite(opts.pgliteDir, template);
    if (template) opts.log?.debug({ template }, 'the embedded database loaded from its template');
    const knex = knexFactory({
      client: ClientPgLite,
      dialect: 'postgres',
      connection: pgliteConnection(pglite),
      // PGlite has one connection: anything waiting longer than this is a bug (a query outside `trx`).
      acquireConnectionTimeout: 20_000,
      log: knexLog(opts.log),
    });
    await knex.raw('select 1');
    return {
      knex,
      dialect: 'pglite',
      async close() {
        try {
          await knex.destroy();
          ownerOnly(opts.pgliteDir);
        } finally {
          lock.release();
        }
      },
    };
  } catch (err) {
    // An open PGlite would keep the process alive after a start that failed.
    if (pglite && !pglite.closed) await pglite.close().catch(() => {});
    lock.release();
    throw err;
  }
}

/**
 * The embedded database's directory, made or kept 0700 before PGlite opens it: no other user can enter
 * it, whatever the modes of the files inside (PGlite writes its files as 0666, its Emscripten file
 * system knowing no umask). What is inside is set to its owner's alone when the database closes
 * (ownerOnly); walking its thousand-odd files at each open as well cost a command 40-90 ms.
 */
function closedToOthers(dir: string): void {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  fs.chmodSync(dir, 0o700);
}

/**
 * The embedded database's files are its owner's alone, whatever the umask: every directory 0700, every
 * file 0600. Run when the database closes; a file PGlite creates while it is open lies inside the 0700
 * directory (closedToOthers), which no other user can enter.
 */
export function ownerOnly(dir: string): void {
  closedToOthers(dir);
  const walk = (at: string) => {
    for (const entry of fs.readdirSync(at, { withFileTypes: true })) {
      const full = path.join(at, entry.name);
      if (entry.isDirectory()) {
        fs.chmodSync(full, 0o700);
        walk(full);
      } else if (entry.isFile()) fs.chmodSync(full, 0o600);
    }
  };
  walk(dir);
}

/** Which database a knex instance (or one of its transactions) talks to. */
export function dialectOf(knex: Knex | Knex.Transaction): Dialect {
  return knex.client.config.client === 'pg' ? 'postgres' : 'pglite';
}

/** Each statement's text with its `?` placeholders as PostgreSQL numbers them ($1, $2, …), worked out once. */
const numberedText = new Map<string, string>();

/**
 * Names a read the hot path makes on every call of its kind, so that each PostgreSQL connection parses
 * and plans it once (planning one of these took longer than running it: 0.08–0.17 ms against
 * 0.01–0.03 ms). `name` (`countersign_…`) must stand for one text: the query's shape never varies under
 * it (pg refuses a second text for a name rather than run it). Valid while the schema does not change
 * under a running server, which upgrading never does (every replica stops first, docs/operations.md).
 * On PGlite, as is.
 */
export function named<Q extends { options(options: Readonly<Record<string, unknown>>): unknown }>(
  knex: Knex,
  name: string,
  query: Q,
): Q {
  return dialectOf(knex) === 'postgres' ? (query.options({ name }) as Q) : query;
}

/** PGlite, or a transaction (whose connection knex holds): the statement goes through knex. */
const throughKnex = (knex: Knex) => dialectOf(knex) !== 'postgres' || knex.isTransaction;

const viaKnex = (knex: Knex, name: string, sql: string, values: readonly unknown[]) =>
  named(knex, name, knex.raw(sql, values as Knex.RawBinding[]));

/** Announces the statement as knex's `query` event; returns its text with numbered placeholders. */
function announced(knex: Knex, name: string, sql: string, values: readonly unknown[], uid: string): string {
  // Keyed by the text, not the name: pg refuses one name for two texts rather than run the wrong one.
  let text = numberedText.get(sql);
  if (text === undefined) {
    let n = 0;
    text = sql.replace(/\?/g, () => `$${++n}`);
    numberedText.set(sql, text);
  }
  knex.emit('query', { method: 'raw', sql, bindings: values, options: { name }, __knexUid: uid });
  return text;
}

/** knex's mark on a pg connection that failed: the pool destroys it instead of handing it out again. */
type Disposable = pg.ClientBase & { __knex__disposed?: unknown };

/**
 * Runs statements that the hot path runs on every call (the audit log's appends, one batch at a time),
 * each as a named prepared statement: on PostgreSQL straight on a connection of knex's pool, without
 * knex's query pipeline (its builder, runner and response processing cost about 0.1 ms on a sequential
 * call's audit append, measured); on PGlite, or inside a transaction (whose connection knex holds),
 * through knex. `sql` uses knex's `?` placeholders, and nothing else in it may be a `?`. Each statement
 * is still announced as knex's `query` event, so that whatever counts statements (the metrics, the
 * round-trip tests) counts it.
 *
 * The pool's connection is kept from one statement to the next and handed back after `idleMs` without
 * one, instead of being acquired and released around each — about 50 µs on a sequential call's way to
 * its audit statement and as much after it, measured on a slow VM. A connection the pool would discard
 * (it failed) is handed back at once. `release` hands it back now: the pool waits for it before it can
 * close. For one user at a time: statements that follow each other, not concurrent ones.
 */
export function keptConnection(knex: Knex, idleMs = 100) {
  let kept: Promise<pg.ClientBase> | undefined;
  let idle: NodeJS.Timeout | undefined;
  const release = async () => {
    clearTimeout(idle);
    const pending = kept;
    kept = undefined;
    const connection = await pending?.catch(() => undefined);
    if (connection) await knex.client.releaseConnection(connection);
  };
  const failed = (c: pg.ClientBase) => Boolean((c as Disposable).__knex__disposed);
  // Its statements under a name of their own in knex's events (they follow each other, one at a time).
  const uid = `kept-${randomUUID()}`;
  return {
    async run(
      name: string,
      sql: string,
      values: readonly unknown[],
    ): Promise<{ rowCount: number | null; rows: unknown[] }> {
      if (throughKnex(knex)) return viaKnex(knex, name, sql, values);
      clearTimeout(idle);
      const text = announced(knex, name, sql, values, uid);
      // Answered or failed: said as knex says it, so that the time each statement waited is known
      // (server/waits.ts).
      const event = { sql, __knexUid: uid };
      if (kept && failed(await kept)) await release();
      kept ??= knex.client.acquireConnection() as Promise<pg.ClientBase>;
      const connection = await kept.catch(async (err: unknown) => {
        kept = undefined;
        knex.emit('query-error', err, event);
        throw err;
      });
      try {
        const result = await connection.query({ name, text, values: values as unknown[] });
        knex.emit('query-response', result, event);
        return result;
      } catch (err) {
        knex.emit('query-error', err, event);
        // Marked as knex marks a connection that failed, so that the pool discards it.
        if (isConnectionError(err)) (connection as Disposable).__knex__disposed ??= err;
        throw err;
      } finally {
        if (failed(connection)) await release();
        else idle = setTimeout(() => void release(), idleMs).unref();
      }
    },
    release,
  };
}

const CONNECTION_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENOTFOUND',
]);

/**
 * Whether `err` says the database cannot be reached (refused, reset, gone, no connection to be had in
 * time) rather than that a query was wrong: the first is an outage to report as such, the second a bug.
 */
export function isConnectionError(err: unknown): boolean {
  const e = err as { code?: unknown; name?: unknown; message?: unknown } | null;
  if (!e || typeof e !== 'object') return false;
  const code = typeof e.code === 'string' ? e.code : '';
  // SQLSTATE class 08: connection exception; 57P01-57P03: the server is shutting down or starting up.
  if (CONNECTION_CODES.has(code) || /^08/.test(code) || /^57P0[123]$/.test(code)) return true;
  if (e.name === 'KnexTimeoutError') return true;
  return /Connection terminated|connection is closed|Client has encountered a connection error/i.test(
    String(e.message ?? ''),
  );
}

/** `count(*)` is a number on PGlite and a string on pg. */
export function toCount(value: unknown): number {
  return typeof value === 'number' ? value : Number(value ?? 0);
}
