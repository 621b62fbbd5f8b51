import { createHmac, randomBytes } from 'node:crypto';
import { z } from 'zod';
import type { Queryable } from '../db/knex.ts';
import { Role, type User } from '../core/identity.ts';
import type { AuditLog } from '../audit/index.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { auditTampered, userSealed } from './authority.ts';
import { sessions } from './store/index.ts';

export interface WebSession {
  user: User;
  csrf: string;
}

/**
 * The people's web sessions (table web_sessions, accounts' own: a user's change drops them in the same
 * transaction). They live in the database, shared by every instance; the cookie holds a random id,
 * stored as its HMAC under `key` (the host roots' session key, docs/audit.md "Host roots"): a row
 * inserted by whoever administers the database, without that key, matches no cookie. A session ends
 * `idleMs` after it was last seen, or `absoluteMs` after it began.
 */
export function createSessionStore(
  knex: Queryable,
  lifetime: { idleMs: number; absoluteMs: number },
  key: Buffer,
  /**
   * The host roots, to check the session's user against its seal (authority.ts) from the columns the
   * session's one query reads; a user whose record fails is refused like a disabled one, and recorded.
   */
  sealed?: { roots: HostRoots; audit?: Pick<AuditLog, 'append'> },
) {
  const { idleMs, absoluteMs } = lifetime;
  const hashId = (id: string) => createHmac('sha256', key).update(id).digest('hex');

  return {
    /** A brand-new session id at every login: a session id planted before login is worthless. */
    async create(user: User): Promise<{ id: string; csrf: string }> {
      // The cookie names its user, and its MAC (the row's key) covers that name: a row's user_id
      // changed by SQL, to make someone's session a chair's, no longer matches the cookie.
      const id = `${user.id}.${randomBytes(32).toString('base64url')}`;
      const csrf = randomBytes(32).toString('base64url');
      const now = new Date().toISOString();
      await sessions.insert(knex, {
        id_hash: hashId(id),
        user_id: user.id,
        csrf_token: csrf,
        created_at: now,
        last_seen_at: now,
      });
      return { id, csrf };
    },

    /** The live session for a cookie value, touching its idle clock; expired sessions are deleted. */
    async load(id: string | undefined): Promise<WebSession | undefined> {
      if (!id || id.length > 100) return undefined;
      const row = await sessions.withUser(knex, hashId(id));
      if (!row) return undefined;
      // A session row whose user is not the one its cookie names was re-pointed by SQL (or made before
      // cookies named their user: signed in again once).
      const owner = id.indexOf('.') > 0 ? id.slice(0, id.indexOf('.')) : undefined;
      if (owner === undefined) return undefined;
      if (String(row.user_id) !== owner) {
        await auditTampered(sealed?.audit, 'user', String(row.name), 'session_user_changed');
        return undefined;
      }
      if (sealed && !userSealed(sealed.roots, { ...row, id: row.user_id })) {
        await auditTampered(sealed.audit, 'user', String(row.name), 'session');
        return undefined;
      }
      const now = Date.now();
      const created = new Date(row.created_at as string).getTime();
      const seen = new Date(row.last_seen_at as string).getTime();
      if (now - seen > idleMs || now - created > absoluteMs) {
        await sessions.remove(knex, String(row.id_hash));
        return undefined;
      }
      if (now - seen > 10_000) {
        await sessions.touch(knex, String(row.id_hash), new Date(now).toISOString());
      }
      const roles = z.array(Role).parse(typeof row.roles === 'string' ? JSON.parse(row.roles) : row.roles);
      return {
        user: { id: String(row.user_id), name: String(row.name), roles },
        csrf: String(row.csrf_token),
      };
    },

    async destroy(id: string | undefined): Promise<void> {
      if (id) await sessions.remove(knex, hashId(id));
    },
  };
}

export type SessionStore = ReturnType<typeof createSessionStore>;
