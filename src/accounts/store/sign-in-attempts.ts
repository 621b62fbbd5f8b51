import { toCount, type Queryable, type Transaction } from '../../db/knex.ts';

/*
 * Sign-in attempts (sign_in_attempts): every statement on them. The limits, and what a reservation
 * counts under, are in sign-in.ts, which runs these in one transaction per reservation.
 */

/**
 * What attempts count together: passwords (the web form and the CLI's `--as USER`) per user name and per
 * origin, single sign-on callbacks per origin only. A flood of one never locks out the other.
 */
export type AttemptBucket = 'password' | 'oidc_callback';

/** Advisory lock classes (two-key form): one per kind of key, always taken origin first, then name. */
const ORIGIN_LOCK = 0x5349_4f01;
const NAME_LOCK = 0x5349_4e01;

/** Takes the origin's advisory lock, held until `trx` ends. */
export async function lockOrigin(trx: Transaction, origin: string) {
  await trx.raw('select pg_advisory_xact_lock(?, hashtext(?))', [ORIGIN_LOCK, origin]);
}

/** Takes the name's advisory lock, held until `trx` ends (after the origin's). */
export async function lockName(trx: Transaction, name: string) {
  await trx.raw('select pg_advisory_xact_lock(?, hashtext(?))', [NAME_LOCK, name]);
}

/** Deletes attempts older than `window`, skipping rows another attempt is deleting. */
export async function purgeOlderThan(trx: Transaction, window: string) {
  await trx.raw(
    `delete from sign_in_attempts where id in
         (select id from sign_in_attempts where at < now() - ?::interval for update skip locked)`,
    [window],
  );
}

/** How many attempts of `bucket` under `column` = `value` are younger than `window`. */
export async function countWithin(
  trx: Transaction,
  bucket: AttemptBucket,
  column: 'origin' | 'name',
  value: string,
  window: string,
): Promise<number> {
  return trx('sign_in_attempts')
    .where({ bucket, [column]: value })
    .where('at', '>=', trx.raw('now() - ?::interval', [window]))
    .count({ n: '*' })
    .first()
    .then((row) => toCount(row?.n));
}

/** Records an attempt: its id. */
export async function insert(
  trx: Transaction,
  attempt: { bucket: AttemptBucket; name: string | null; origin: string },
) {
  const [row] = (await trx('sign_in_attempts').insert(attempt).returning('id')) as { id: number | string }[];
  return Number(row!.id);
}

/** Deletes the attempt `id`: what it was counted under, if it was still there. */
export async function remove(q: Queryable, id: number) {
  const [row] = (await q('sign_in_attempts')
    .where({ id })
    .delete()
    .returning(['bucket', 'origin', 'name'])) as {
    bucket: AttemptBucket;
    origin: string;
    name: string | null;
  }[];
  return row;
}
