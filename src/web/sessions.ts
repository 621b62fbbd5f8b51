import { timingSafeEqual } from 'node:crypto';
import type { NextFunction, Request, Response } from 'express';
import type { SessionStore } from '../accounts/index.ts';

/** The session store is accounts' (src/accounts/sessions.ts); the pages keep only the cookie's side. */
export type { SessionStore, WebSession } from '../accounts/index.ts';

export const SESSION_COOKIE = 'cs_session';

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

/** The session of the request's cookie, if live, in res.locals; no page is ever cached. */
export function loadSession(sessions: SessionStore) {
  return async (req: Request, res: Response, next: NextFunction) => {
    res.locals.sessionId = readCookies(req.get('cookie'))[SESSION_COOKIE];
    res.locals.session = await sessions.load(res.locals.sessionId as string | undefined);
    res.set('Cache-Control', 'no-store');
    next();
  };
}
