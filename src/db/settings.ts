import type { Knex } from 'knex';

type Query = Knex | Knex.Transaction;

/** A value every instance on one database agrees on, created by whichever instance asks first. */
export async function sharedValue(knex: Knex, name: string, make: () => string): Promise<string> {
  await knex('server_secrets').insert({ name, value: make() }).onConflict('name').ignore();
  const row = (await knex('server_secrets').where({ name }).first()) as { value: string };
  return row.value;
}

/** jsonb comes back parsed (pg) or as text (some PGlite paths). */
const parsed = (value: unknown): unknown => (typeof value === 'string' ? JSON.parse(value) : value);

/**
 * A setting (table `settings`), or undefined when it was never written. `forUpdate` (in a transaction)
 * also locks its row until the transaction ends.
 */
export async function readSetting(
  q: Query,
  name: string,
  opts: { forUpdate?: boolean } = {},
): Promise<unknown> {
  const where = q('settings').where({ name });
  const query = opts.forUpdate ? where.forUpdate() : where;
  const row = (await query.first('value')) as { value: unknown } | undefined;
  return row === undefined ? undefined : parsed(row.value);
}

/**
 * A setting (undefined when there is none) and, in the same statement, the value of `alsoSql` (a SQL
 * expression of the caller's, e.g. what the log says of the setting's last change): one round trip
 * where a check of the setting needs both.
 */
export async function readSettingWith(
  q: Query,
  name: string,
  alsoSql: string,
): Promise<{ value: unknown; also: unknown }> {
  const row = (await q
    .select(
      q.raw('(select value from settings where name = ?) as value', [name]),
      q.raw(`(${alsoSql}) as also`),
    )
    .first()) as { value: unknown; also: unknown };
  return { value: row.value === null ? undefined : parsed(row.value), also: row.also };
}

/** Writes a setting, replacing any value it had. */
export async function writeSetting(q: Query, name: string, value: object): Promise<void> {
  await q('settings')
    .insert({ name, value: JSON.stringify(value), updated_at: q.fn.now() })
    .onConflict('name')
    .merge(['value', 'updated_at']);
}

/**
 * Replaces a setting only if it still holds `expected` (compared as JSON values): a change made in the
 * meantime by another instance wins, and the caller learns so (false).
 */
export async function replaceSetting(
  q: Query,
  name: string,
  expected: object,
  next: object,
): Promise<boolean> {
  const changed = await q('settings')
    .where({ name })
    .whereRaw('value = ?::jsonb', [JSON.stringify(expected)])
    .update({ value: JSON.stringify(next), updated_at: q.fn.now() });
  return changed > 0;
}

/** A shared value (sharedValue) as recorded, without creating it: undefined when none was made yet. */
export async function recordedValue(q: Query, name: string): Promise<string | undefined> {
  const row = (await q('server_secrets').where({ name }).first('value')) as { value: string } | undefined;
  return row?.value;
}

/** Named settings (table `settings`) as a store: read one, or replace it only if it still holds a value. */
export interface Settings {
  read(name: string): Promise<unknown>;
  /** replaceSetting: false when another instance changed it first. */
  replace(name: string, expected: object, next: object): Promise<boolean>;
}

export function createSettings(knex: Knex): Settings {
  return {
    read: (name) => readSetting(knex, name),
    replace: (name, expected, next) => replaceSetting(knex, name, expected, next),
  };
}

/**
 * SQL true unless the setting `name` holds, at `key`, a JSON value other than the one bound (`?`, JSON
 * text): no row, or the same value (compared as jsonb, so key order and spacing do not matter). For a
 * statement that must act only while a setting is what its caller last read, with no statement of its
 * own.
 */
export const settingUnchangedSql = (name: string, key: string) =>
  `not exists (select 1 from settings s where s.name = '${name}' and (s.value -> '${key}') is distinct from ?::jsonb)`;
