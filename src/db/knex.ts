import fs from 'node:fs';
import knexFactory, { type Knex } from 'knex';
import pg from 'pg';
import { lockDataDir, type DirLock } from './lock.ts';

// bigint (seq) and numeric as JS numbers: every value we store fits in 2^53.
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => Number(v));

export type Dialect = 'pglite' | 'postgres';

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
}

/** Opens PostgreSQL when a URL is given, else the embedded PGlite database (locked to this process). */
export async function openDatabase(opts: DatabaseOptions): Promise<Database> {
  if (opts.url) {
    const knex = knexFactory({
      client: 'pg',
      connection: opts.url,
      pool: { min: 0, max: opts.poolMax ?? 10 },
      acquireConnectionTimeout: 10_000,
    });
    await knex.raw('select 1');
    return { knex, dialect: 'postgres', close: () => knex.destroy() };
  }

  const lock: DirLock = lockDataDir(opts.pgliteDir, opts.command);
  try {
    fs.mkdirSync(opts.pgliteDir, { recursive: true });
    // Loaded only here: PGlite's module alone adds tens of MB to a process that talks to PostgreSQL.
    const { default: ClientPgLite } = await import('knex-pglite');
    const knex = knexFactory({
      client: ClientPgLite,
      dialect: 'postgres',
      connection: { filename: opts.pgliteDir },
      // PGlite has one connection: anything waiting longer than this is a bug (a query outside `trx`).
      acquireConnectionTimeout: 20_000,
    });
    await knex.raw('select 1');
    return {
      knex,
      dialect: 'pglite',
      async close() {
        try {
          await knex.destroy();
        } finally {
          lock.release();
        }
      },
    };
  } catch (err) {
    lock.release();
    throw err;
  }
}

/** Which database a knex instance (or one of its transactions) talks to. */
export function dialectOf(knex: Knex | Knex.Transaction): Dialect {
  return knex.client.config.client === 'pg' ? 'postgres' : 'pglite';
}

/** Each statement's text with its `?` placeholders as PostgreSQL numbers them ($1, $2, …), worked out once. */
const numberedText = new Map<string, string>();

/**
 * Runs one statement that the hot path runs on every call, as a named prepared statement: on
 * PostgreSQL straight on a connection of knex's pool, without knex's query pipeline (its builder,
 * runner and response processing cost about 0.1 ms on a sequential call's audit append, measured);
 * on PGlite, or inside a transaction (whose connection knex holds), through knex. `sql` uses knex's
 * `?` placeholders, and nothing else in it may be a `?`. The statement is still announced as knex's
 * `query` event, so that whatever counts statements (the metrics, the round-trip tests) counts it.
 */
export async function runPrepared(
  knex: Knex,
  name: string,
  sql: string,
  values: readonly unknown[],
): Promise<{ rowCount: number | null; rows: unknown[] }> {
  const postgres = dialectOf(knex) === 'postgres';
  if (!postgres || knex.isTransaction) {
    const raw = knex.raw(sql, values as Knex.RawBinding[]);
    return postgres ? raw.options({ name }) : raw;
  }
  // Keyed by the text, not the name: pg refuses one name for two texts rather than run the wrong one.
  let text = numberedText.get(sql);
  if (text === undefined) {
    let n = 0;
    text = sql.replace(/\?/g, () => `$${++n}`);
    numberedText.set(sql, text);
  }
  knex.emit('query', { method: 'raw', sql, bindings: values, options: { name } });
  // knex's pool hands out pg clients; one that errors is marked and discarded by the pool on return.
  const connection = (await knex.client.acquireConnection()) as pg.ClientBase;
  try {
    return await connection.query({ name, text, values: values as unknown[] });
  } finally {
    await knex.client.releaseConnection(connection);
  }
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
