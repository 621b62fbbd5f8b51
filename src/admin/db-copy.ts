import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { Knex } from 'knex';
import { verifyDatabase } from '../audit/index.ts';
import type { Config } from '../config.ts';
import { AppError } from '../core/errors.ts';
import { isConnectionError, openDatabase, type Database } from '../db/knex.ts';
import { lockedBy, lockHolder, type LockHolder } from '../db/lock.ts';
import { MigrationSource, migrateLatest } from '../db/migrations.ts';
import { postgresProblem } from './pg-errors.ts';

/**
 * `countersign db copy --to URL`: everything the embedded database holds, into an empty PostgreSQL
 * database, in one transaction there. The target is migrated, every kept table copied in dependency
 * order, and the copy checked (rows and content per table, the audit chain and its checkpoints) before
 * the transaction commits: a copy that differs leaves the target as empty as it was.
 */

/** The tables copied, parents before children (foreign keys), and why each is state worth keeping. */
export const COPIED_TABLES = [
  { table: 'users', why: 'people, roles and password hashes: the same sign-ins' },
  // After users: an agent's owner is one (agents.owner_id).
  { table: 'agents', why: 'agents and their token hashes: the old tokens keep working' },
  { table: 'contacts', why: 'the local store' },
  { table: 'groups', why: 'the local store' },
  { table: 'group_members', why: 'the local store' },
  { table: 'conversations', why: 'the local store' },
  { table: 'messages', why: 'the local store, with the write keys of executed approvals' },
  { table: 'files', why: "file metadata (the bytes are in the data directory's blobs/)" },
  { table: 'server_secrets', why: "cursor key, audit log origin, the signing key's public half" },
  { table: 'settings', why: "installation facts, e.g. that the first run's banner was shown" },
  { table: 'approval_requests', why: 'approvals in every state' },
  { table: 'approval_decisions', why: "the chairs' decisions" },
  { table: 'approval_tasks', why: 'writes asked as tasks: the copy runs and answers them' },
  { table: 'notification_outbox', why: 'notices: those not yet delivered go out from the copy' },
  { table: 'slack_messages', why: "where each request's Slack message is, so its outcome updates it" },
  { table: 'idempotency_keys', why: 'retries of real writes answer the stored result' },
  { table: 'agent_memory', why: "agents' notes" },
  { table: 'upstream_tool_pins', why: "upstream tools' pinned classes: a move never trusts a listing anew" },
  { table: 'audit_events', why: 'the hash chain, in seq order, every column as stored' },
  { table: 'audit_checkpoints', why: 'signed checkpoints, each with its public key' },
  { table: 'audit_anchors', why: 'the time-stamp tokens of checkpoints (off-box anchors)' },
  { table: 'audit_exports', why: 'the record of exports and their manifests' },
  {
    table: 'refusal_counts',
    why: "refusals counted past a minute's own rows and not yet summed: the copy writes their summaries",
  },
] as const;

/** Tables deliberately left behind, and why. Every table must be in one list or the other. */
export const SKIPPED_TABLES: Readonly<Record<string, string>> = {
  web_sessions: 'web sign-ins end with the move: people sign in again',
  rate_windows: 'per-minute call counts, stale by the time the copy is served',
  slack_callbacks_seen:
    'Slack callbacks already taken: by the time the copy serves, each is refused as stale',
  sign_in_attempts: 'sign-in attempts of the last 15 minutes, for the failure limits; they start anew',
  knex_migrations: 'the target records the migrations it ran itself',
  knex_migrations_lock: 'the target records the migrations it ran itself',
};

/** The reason of a refusal of the command line or the target: nothing was done (the CLI's exit 2). */
export const REFUSED = 'db_copy_refused';
const refused = (message: string) => new AppError('CONFIG_INVALID', message, REFUSED);

const PAGE_ROWS = 1000;

const ident = (name: string) => `"${name.replace(/"/g, '""')}"`;

/** The --to URL, checked; its password never appears in a message. */
function targetUrl(to: string): URL {
  const form = 'postgres://user:password@host:5432/database';
  let url: URL;
  try {
    url = new URL(to);
  } catch {
    throw refused(`option '--to <url>' must be a PostgreSQL URL such as ${form}`);
  }
  if (url.protocol !== 'postgres:' && url.protocol !== 'postgresql:')
    throw refused(`option '--to <url>' must start with postgres:// (as in ${form})`);
  if (url.pathname.length <= 1) throw refused(`option '--to <url>' must name the database (as in ${form})`);
  return url;
}

/** The target as it may be printed: user, host, port and database, never the password. */
function describeTarget(to: string): string {
  const url = new URL(to);
  const user = url.username ? `${decodeURIComponent(url.username)}@` : '';
  return `${user}${url.hostname || 'localhost'}:${url.port || '5432'}/${decodeURIComponent(url.pathname.slice(1))}`;
}

/** The base tables of the current schema. */
export async function listTables(q: Knex | Knex.Transaction): Promise<string[]> {
  const { rows } = (await q.raw(
    `select c.relname as name from pg_class c
      where c.relnamespace = current_schema()::regnamespace and c.relkind in ('r', 'p')
      order by c.relname collate "C"`,
  )) as { rows: { name: string }[] };
  return rows.map((r) => r.name);
}

/** Tables the source holds that neither list names, and listed tables it lacks. */
async function unhandledTables(q: Knex): Promise<{ unknown: string[]; missing: string[] }> {
  const present = await listTables(q);
  const known = new Set<string>([...COPIED_TABLES.map((t) => t.table), ...Object.keys(SKIPPED_TABLES)]);
  return {
    unknown: present.filter((t) => !known.has(t)),
    missing: COPIED_TABLES.map((t) => t.table).filter((t) => !present.includes(t)),
  };
}

interface KeyColumn {
  name: string;
  type: string;
}

/** The primary key's columns and their types: pages are read in its order. */
async function primaryKey(q: Knex | Knex.Transaction, table: string): Promise<KeyColumn[]> {
  const { rows } = (await q.raw(
    `select a.attname as name, format_type(a.atttypid, a.atttypmod) as type
       from pg_index i join pg_attribute a on a.attrelid = i.indrelid and a.attnum = any(i.indkey)
      where i.indrelid = to_regclass(quote_ident(?)) and i.indisprimary
      order by array_position(i.indkey::int2[], a.attnum)`,
    [table],
  )) as { rows: KeyColumn[] };
  if (rows.length === 0) throw new Error(`table ${table} has no primary key to page by`);
  return rows;
}

/**
 * A table's rows as JSON text (to_jsonb, which both databases print alike), in primary-key order with
 * text compared byte-wise, so the source and the copy are read in the same order whatever their
 * collations. The JSON text never passes through JavaScript values: bigints and timestamps stay exact.
 */
async function* readPages(q: Knex | Knex.Transaction, table: string): AsyncGenerator<string[]> {
  const key = await primaryKey(q, table);
  const order = key.map((k) => `t.${ident(k.name)}${k.type === 'text' ? ' collate "C"' : ''}`).join(', ');
  const keyText = key.map((k, i) => `t.${ident(k.name)}::text as k${i}`).join(', ');
  const placeholders = key.map((k) => `?::${k.type}`).join(', ');
  let after: string[] | undefined;
  for (;;) {
    const where = after ? `where (${order}) > (${placeholders})` : '';
    const { rows } = (await q.raw(
      `select to_jsonb(t)::text as r, ${keyText} from ${ident(table)} t ${where} order by ${order} limit ${PAGE_ROWS}`,
      after ?? [],
    )) as { rows: Record<string, string>[] };
    if (rows.length > 0) yield rows.map((r) => r.r!);
    if (rows.length < PAGE_ROWS) return;
    const last = rows.at(-1)!;
    after = key.map((_, i) => last[`k${i}`]!);
  }
}

/** A table's row count and the SHA-256 of its rows' JSON text in key order: equal tallies, equal tables. */
export interface Tally {
  rows: number;
  sha256: string;
}

const tallier = () => {
  const hash = createHash('sha256');
  let rows = 0;
  return {
    add(page: string[]) {
      for (const row of page) hash.update(row).update('\n');
      rows += page.length;
    },
    done: (): Tally => ({ rows, sha256: hash.digest('hex') }),
  };
};

async function tallyTable(q: Knex | Knex.Transaction, table: string): Promise<Tally> {
  const tally = tallier();
  for await (const page of readPages(q, table)) tally.add(page);
  return tally.done();
}

/** Copies one table page by page; the rows go in as their JSON text, converted back by the target. */
async function copyTable(source: Knex, target: Knex.Transaction, table: string): Promise<Tally> {
  const tally = tallier();
  for await (const page of readPages(source, table)) {
    await target.raw(
      `insert into ${ident(table)} select * from jsonb_populate_recordset(null::${ident(table)}, ?::jsonb)`,
      [`[${page.join(',')}]`],
    );
    tally.add(page);
  }
  return tally.done();
}

/** Sequences behind serial columns continue after the copied rows, not from 1. */
async function resetSequences(trx: Knex.Transaction, table: string): Promise<void> {
  const { rows } = (await trx.raw(
    `select a.attname as col, pg_get_serial_sequence(quote_ident(?), a.attname) as seq
       from pg_attribute a
      where a.attrelid = to_regclass(quote_ident(?)) and a.attnum > 0 and not a.attisdropped`,
    [table, table],
  )) as { rows: { col: string; seq: string | null }[] };
  for (const { col, seq } of rows) {
    if (!seq) continue;
    await trx.raw(
      `select setval(?::regclass, coalesce((select max(${ident(col)}) from ${ident(table)}), 0) + 1, false)`,
      [seq],
    );
  }
}

/** What differs between two sets of tallies, one line per table; none when the copy is exact. */
export function tallyDifferences(source: Map<string, Tally>, target: Map<string, Tally>): string[] {
  const lines: string[] = [];
  for (const [table, s] of source) {
    const t = target.get(table);
    if (!t) lines.push(`${table}: missing in the copy`);
    else if (t.rows !== s.rows) lines.push(`${table}: ${s.rows} rows in the source, ${t.rows} in the copy`);
    else if (t.sha256 !== s.sha256) lines.push(`${table}: same ${s.rows} rows, different contents`);
  }
  return lines;
}

/** The tallies of every copied table, read from one database, with times printed in UTC on either side. */
export async function tallyAll(q: Knex | Knex.Transaction): Promise<Map<string, Tally>> {
  return q.transaction(async (trx) => {
    await trx.raw(`set local time zone 'UTC'`);
    const tallies = new Map<string, Tally>();
    for (const { table } of COPIED_TABLES) tallies.set(table, await tallyTable(trx, table));
    return tallies;
  });
}

/** Refuses a target that holds countersign's tables (even empty) or any table with rows. */
async function refuseNonEmpty(trx: Knex | Knex.Transaction, target: string): Promise<void> {
  const { rows } = (await trx.raw(
    `select n.nspname as schema, c.relname as name from pg_class c join pg_namespace n on n.oid = c.relnamespace
      where c.relkind in ('r', 'p') and n.nspname not in ('pg_catalog', 'information_schema')
        and n.nspname not like 'pg\\_toast%' order by 1, 2`,
  )) as { rows: { schema: string; name: string }[] };
  const ours = new Set<string>([...COPIED_TABLES.map((t) => t.table), ...Object.keys(SKIPPED_TABLES)]);
  const found: string[] = [];
  for (const { schema, name } of rows) {
    const qualified = `${ident(schema)}.${ident(name)}`;
    const { rows: probe } = (await trx.raw(`select exists (select 1 from ${qualified}) as has`)) as {
      rows: { has: boolean }[];
    };
    if (ours.has(name)) found.push(`${schema}.${name} (a countersign table)`);
    else if (probe[0]!.has) found.push(`${schema}.${name} (has rows)`);
  }
  if (found.length === 0) return;
  const shown = found.slice(0, 5).join(', ') + (found.length > 5 ? `, and ${found.length - 5} more` : '');
  throw refused(
    `the target database ${target} is not empty: ${shown}. db copy writes only into an empty database ` +
      `(create one with createdb and give its URL). Nothing was changed.`,
  );
}

export interface CopyReport {
  source: string;
  target: string;
  /** Migrations the embedded database lacked, applied to it before copying. */
  source_migrations: string[];
  tables: { table: string; rows: number }[];
  /** The target's audit verification, as `audit verify --db` prints it. */
  audit_summary: string;
  head_seq: number;
}

/** The source must itself verify: a broken chain is evidence to keep where it is, not to move. */
async function verifiedSource(source: Knex, dir: string) {
  const result = await verifyDatabase(source);
  if (!result.ok)
    throw new AppError(
      'TAMPERED',
      `the audit log in ${dir} does not verify, so it was not copied (nothing was changed): ${result.summary}`,
      'source_chain_invalid',
    );
  return result;
}

/** Migrates the target and copies into it, in the caller's transaction; throws if the copy differs. */
async function copyInto(
  source: Knex,
  trx: Knex.Transaction,
  target: string,
  sourceChain: { rows: number; head_hash: string },
  checkpoints: number,
) {
  await refuseNonEmpty(trx, target);
  // Timestamps as JSON text in one zone on both sides, so equal rows print (and hash) alike.
  await trx.raw(`set local time zone 'UTC'`);
  // knex's migrator directly: the target is known to be new, and a probe that fails would abort the transaction.
  await trx.migrate.latest({ migrationSource: new MigrationSource() });
  const copied = new Map<string, Tally>();
  for (const { table } of COPIED_TABLES) {
    copied.set(table, await copyTable(source, trx, table));
    await resetSequences(trx, table);
  }
  const differences = tallyDifferences(copied, await tallyAll(trx));
  const check = await verifyDatabase(trx);
  if (!check.ok) differences.push(`audit log in the copy: ${check.summary.replace(/\n/g, '; ')}`);
  else if (check.chain.rows !== sourceChain.rows || check.chain.head_hash !== sourceChain.head_hash)
    differences.push(`audit chain: ${sourceChain.rows} rows in the source, ${check.chain.rows} in the copy`);
  else if (check.checkpoints !== checkpoints)
    differences.push(`audit checkpoints: ${checkpoints} in the source, ${check.checkpoints} in the copy`);
  if (differences.length > 0)
    throw new AppError(
      'TAMPERED',
      `the copy does not match the source, so it was rolled back (the target is as it was): ${differences.join('; ')}`,
      'copy_differs',
    );
  return { copied, check };
}

/** The embedded database is held by a running server: the usual refusal, with what to do. */
const held = (dir: string, holder: LockHolder) =>
  new AppError(
    'LOCKED',
    `the database in ${dir} is held by another countersign process (pid ${holder.pid} on ${holder.hostname}, ` +
      `"${holder.command}", since ${holder.started_at}); stop it first: db copy needs the embedded database ` +
      `to itself. Nothing was copied.`,
    'data_dir_locked',
  );

/** Refuses, before anything is opened, an embedded database that is not there or that a server holds. */
function checkSource(cfg: Config): void {
  if (!fs.existsSync(cfg.pglite_dir))
    throw new AppError(
      'NOT_FOUND',
      `there is no embedded database to copy in ${cfg.pglite_dir}; set COUNTERSIGN_DATA_DIR or run from the right directory. Nothing was created.`,
    );
  const holder = lockHolder(cfg.pglite_dir);
  if (holder) throw held(cfg.pglite_dir, holder);
}

/** Opens the embedded database for the copy; never creates one, never shares it with a server. */
async function openSource(cfg: Config): Promise<Database> {
  checkSource(cfg);
  try {
    return await openDatabase({ pgliteDir: cfg.pglite_dir, command: 'countersign db copy' });
  } catch (e) {
    const holder = lockedBy(e);
    throw holder ? held(cfg.pglite_dir, holder) : e;
  }
}

/** Migrates the source to this version and checks that every table it holds is copied or skipped. */
async function preparedSource(source: Knex, dir: string): Promise<string[]> {
  await source.raw(`set time zone 'UTC'`);
  const applied = await migrateLatest(source);
  const { unknown, missing } = await unhandledTables(source);
  if (unknown.length > 0 || missing.length > 0)
    throw new AppError(
      'CONFIG_INVALID',
      `db copy does not know how to copy this database (${[
        ...unknown.map((t) => `unknown table ${t}`),
        ...missing.map((t) => `no table ${t}`),
      ].join(', ')}); use the countersign version that wrote ${dir}. Nothing was copied.`,
      'unknown_table',
    );
  return applied;
}

/** Copies from the opened source into the opened target, in one transaction there. */
async function copyBetween(source: Knex, target: Knex, cfg: Config, name: string): Promise<CopyReport> {
  const source_migrations = await preparedSource(source, cfg.data_dir);
  const before = await verifiedSource(source, cfg.pglite_dir);
  const { copied, check } = await target
    .transaction((trx) => copyInto(source, trx, name, before.chain, before.checkpoints))
    .catch((e: unknown) => {
      if (!isConnectionError(e)) throw e;
      throw new AppError(
        'SOURCE_UNAVAILABLE',
        `the connection to ${name} failed during the copy, which was not committed: ${(e as Error).message}`,
        undefined,
        { cause: e },
      );
    });
  return {
    source: cfg.pglite_dir,
    target: name,
    source_migrations,
    tables: [...copied].map(([table, t]) => ({ table, rows: t.rows })),
    audit_summary: check.summary,
    head_seq: check.chain.head_seq,
  };
}

/**
 * Copies the configured data directory's embedded database into the empty PostgreSQL database at `to`.
 * Refusals (a bad URL, DATABASE_URL set, a target that is not empty) carry the reason REFUSED.
 */
export async function copyToPostgres(cfg: Config, to: string): Promise<CopyReport> {
  targetUrl(to);
  const name = describeTarget(to);
  if (cfg.database_url)
    throw refused(
      `DATABASE_URL is set, but db copy copies the embedded database in ${cfg.pglite_dir}: unset DATABASE_URL and give the target as --to`,
    );
  checkSource(cfg);
  const problem = await postgresProblem(to);
  if (problem)
    throw new AppError(
      'SOURCE_UNAVAILABLE',
      `${problem.replace(/DATABASE_URL/g, '--to')}. Nothing was copied.`,
    );
  const target = await openDatabase({ url: to, pgliteDir: cfg.pglite_dir, command: 'db copy', poolMax: 1 });
  try {
    // Checked first, to answer at once; checked again in the copy's transaction, where it counts.
    await refuseNonEmpty(target.knex, name);
    const source = await openSource(cfg);
    try {
      return await copyBetween(source.knex, target.knex, cfg, name);
    } finally {
      await source.close();
    }
  } finally {
    await target.close();
  }
}

/** What the CLI prints after a copy: the tables, what stayed behind, and what must stay in the data dir. */
export function describeCopy(report: CopyReport, cfg: Config): string[] {
  const width = Math.max(...report.tables.map((t) => t.table.length));
  const key = cfg.audit.signing_key_path ?? path.join(cfg.data_dir, 'audit-signing-key.pem');
  return [
    ...(report.source_migrations.length > 0
      ? [`migrated the embedded database first: ${report.source_migrations.join(', ')}`]
      : []),
    `copied ${report.source} to PostgreSQL ${report.target}:`,
    ...report.tables.map((t) => `  ${t.table.padEnd(width)}  ${t.rows} rows`),
    `not copied: ${Object.entries(SKIPPED_TABLES)
      .map(([table, why]) => `${table} (${why})`)
      .join('; ')}`,
    `audit log in the copy: ${report.audit_summary.replace(/\n/g, '; ')} (head seq ${report.head_seq}); rows and contents of every table match the source`,
    `kept in the data directory, not in any database: the audit signing key's private half (${key}) and ` +
      `the file bytes (${path.join(cfg.data_dir, 'blobs')}). Run countersign with DATABASE_URL set to the ` +
      `target and the same COUNTERSIGN_DATA_DIR (${cfg.data_dir}), or copy both along; a server with another ` +
      `signing key refuses to start on the copy.`,
  ];
}
