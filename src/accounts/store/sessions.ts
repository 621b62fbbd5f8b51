import { named, type Queryable } from '../../db/knex.ts';
import { USER_SUPERSEDED } from './sql.ts';

/*
 * The people's web sessions (web_sessions): every statement on them. What a session is and when it
 * ends (its key's MAC, its user's seal, the idle and absolute limits) is in sessions.ts.
 */

/** Stores a new session under the MAC of its id. */
export async function insert(
  q: Queryable,
  row: { id_hash: string; user_id: string; csrf_token: string; created_at: string; last_seen_at: string },
) {
  await q('web_sessions').insert(row);
}

/**
 * The session stored under `idHash` whose user is enabled, with what checking that user's seal needs
 * (its sealed columns and freshness), in one statement: every page's first read.
 */
export async function withUser(q: Queryable, idHash: string) {
  const query = q('web_sessions as s')
    .join('users as u', 'u.id', 's.user_id')
    .whereNull('u.disabled_at')
    .where('s.id_hash', idHash)
    .select(
      's.*',
      'u.name',
      'u.roles',
      'u.teams',
      'u.email',
      'u.password_hash',
      'u.oidc_issuer',
      'u.oidc_subject',
      'u.disabled_at',
      'u.authority_mac',
      'u.sealed_seq',
      q.raw(USER_SUPERSEDED('u')),
    )
    .first();
  return (await named(q, 'countersign_web_session', query)) as Record<string, unknown> | undefined;
}

/** Ends the session stored under `idHash`. */
export async function remove(q: Queryable, idHash: string) {
  await q('web_sessions').where('id_hash', idHash).delete();
}

/** Moves the session's idle clock to `at`. */
export async function touch(q: Queryable, idHash: string, at: string) {
  await q('web_sessions').where('id_hash', idHash).update({ last_seen_at: at });
}

/** Ends every session of the user `userId` (in the transaction of the change that ends them). */
export async function removeOfUser(q: Queryable, userId: string) {
  await q('web_sessions').where({ user_id: userId }).delete();
}
