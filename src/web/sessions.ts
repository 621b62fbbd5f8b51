import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Knex } from 'knex';
import { z } from 'zod';
import type { Config } from '../config.ts';
import { named } from '../db/knex.ts';
import { Role, type User } from '../core/identity.ts';

export const SESSION_COOKIE = 'cs_session';

const hashId = (id: string) => createHash('sha256').update(id).digest('hex');

export interface WebSession {
  user: User;
  csrf: string;
}

/** Sessions live in the database (shared by every instance); the cookie holds a random id, stored hashed. */
export function createSessionStore(knex: Knex, config: Config) {
  const idleMs = config.web.session_idle_s * 1000;
  const absoluteMs = config.web.session_absolute_s * 1000;

  return {
    /** A brand-new session id at every login: a session id planted before login is worthless. */
    async create(user: User): Promise<{ id: string; csrf: string }> {
      const id = randomBytes(32).toString('base64url');
      const csrf = randomBytes(32).toString('base64url');
      const now = new Date().toISOString();
      await knex('web_sessions').insert({
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
      const query = knex('web_sessions as s')
        .join('users as u', 'u.id', 's.user_id')
        .whereNull('u.disabled_at')
        .where('s.id_hash', hashId(id))
        .select('s.*', 'u.name', 'u.roles')
        .first();
      const row = (await named(knex, 'countersign_web_session', query)) as
        Record<string, unknown> | undefined;
      if (!row) return undefined;
      const now = Date.now();
      const created = new Date(row.created_at as string).getTime();
      const seen = new Date(row.last_seen_at as string).getTime();
      if (now - seen > idleMs || now - created > absoluteMs) {
        await knex('web_sessions').where('id_hash', String(row.id_hash)).delete();
        return undefined;
      }
      if (now - seen > 10_000) {
        await knex('web_sessions')
          .where('id_hash', String(row.id_hash))
          .update({ last_seen_at: new Date(now).toISOString() });
      }
      const roles = z.array(Role).parse(typeof row.roles === 'string' ? JSON.parse(row.roles) : row.roles);
      return {
        user: { id: String(row.user_id), name: String(row.name), roles },
        csrf: String(row.csrf_token),
      };
    },

    async destroy(id: string | undefined): Promise<void> {
      if (id) await knex('web_sessions').where('id_hash', hashId(id)).delete();
    },
  };
}

export type SessionStore = ReturnType<typeof createSessionStore>;

/** Constant-time comparison of a submitted CSRF token with the expected one. */
export function tokensMatch(given: unknown, expected: string): boolean {
  if (typeof given !== 'string') return false;
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** Parses a Cookie header (express 5 does not). */
export function readCookies(header: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of (header ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq <= 0) continue;
    const name = part.slice(0, eq).trim();
    try {
      out[name] = decodeURIComponent(part.slice(eq + 1).trim());
    } catch {
      // a malformed cookie is ignored, not fatal
    }
  }
  return out;
}
