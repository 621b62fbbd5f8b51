import { randomBytes } from 'node:crypto';
import type { CookieOptions, Response, Router } from 'express';
import type { SignIn } from '../accounts/index.ts';
import type { AuditLog } from '../audit/index.ts';
import type { Config } from '../config.ts';
import type { PageKit } from './kit.ts';
import { readCookies, SESSION_COOKIE, tokensMatch, type SessionStore } from './sessions.ts';

const LOGIN_COOKIE = 'cs_login';
const LOGIN_FORM_MS = 30 * 60 * 1000;

export interface LoginDeps {
  /** The password sign-in, with its limits: the same as the command line's. */
  signIn: SignIn;
  audit: AuditLog;
  config: Config;
  sessions: SessionStore;
}

/**
 * Where to go after sign-in: a path on this origin, else the queue (no open redirect). A path starts with
 * exactly one "/": "//host" and "/\\host" are read by browsers as another host, and they drop tabs and
 * newlines, so "/\t/host" would become "//host" too; a scheme or host never passes the first test.
 */
export function safeNext(next: unknown): string {
  if (typeof next !== 'string' || next.length > 2048) return '/approvals';
  // eslint-disable-next-line no-control-regex -- control characters are exactly what must be refused
  const samePath = /^\/(?![/\\])/.test(next) && !/[\\\u0000-\u001f\u007f]/.test(next);
  if (!samePath || next === '/login' || next.startsWith('/login?')) return '/approvals';
  // It goes into headers (Location, Refresh), which hold Latin-1 only: anything beyond printable ASCII
  // is percent-encoded as UTF-8, as a browser would; a lone surrogate has no encoding and is refused.
  try {
    return next.replace(/[^\x21-\x7e]+/g, (run) => encodeURIComponent(run));
  } catch {
    return '/approvals';
  }
}

/**
 * Sign-in and sign-out. Before sign-in there is no session to hold a CSRF token, so the login form's
 * token travels in a cookie of its own (double submit), renewed with every form shown.
 */
export function mountLoginPages(router: Router, kit: PageKit, deps: LoginDeps): void {
  const cookieBase: CookieOptions = {
    httpOnly: true,
    sameSite: 'strict',
    secure: deps.config.web.secure_cookies,
    path: '/',
  };
  const showForm = (res: Response, status: number, ctx: Record<string, unknown>) => {
    const token = randomBytes(24).toString('base64url');
    res.cookie(LOGIN_COOKIE, token, { ...cookieBase, path: '/login', maxAge: LOGIN_FORM_MS });
    kit.render(res, status, 'login.njk', { csrf: token, sso: deps.config.web.oidc?.label, ...ctx });
  };

  router.get('/login', (req, res) => showForm(res, 200, { next: safeNext(req.query.next) }));

  router.post('/login', async (req, res) => {
    const body = req.body as Record<string, string | undefined>;
    const name = String(body.name ?? '').trim();
    const next = safeNext(body.next);
    const ip = req.socket.remoteAddress ?? 'unknown';
    const again = (status: number, error: string) => showForm(res, status, { next, error, name });
    if (!tokensMatch(body._csrf, readCookies(req.get('cookie'))[LOGIN_COOKIE] ?? '')) {
      return again(403, 'The sign-in form expired. Please try again.');
    }
    const outcome = await deps.signIn.signIn({
      name,
      password: String(body.password ?? ''),
      origin: ip,
      via: 'web',
    });
    if ('refused' in outcome && outcome.refused === 'locked_out') {
      res.set('Retry-After', '900');
      return again(429, 'Too many failed sign-ins. Wait 15 minutes, then try again.');
    }
    if ('refused' in outcome) return again(401, 'Wrong user name or password.');
    const { user } = outcome;
    const created = await deps.sessions.create(user);
    await deps.sessions.destroy(res.locals.sessionId as string | undefined);
    await deps.audit.append({ kind: 'user.login', actor: user.name, result: 'ok', details: { ip } });
    res.clearCookie(LOGIN_COOKIE, { ...cookieBase, path: '/login' });
    res.cookie(SESSION_COOKIE, created.id, cookieBase);
    res.redirect(303, next);
  });

  router.post('/logout', kit.requireUser, kit.requireCsrf, async (_req, res) => {
    await deps.sessions.destroy(res.locals.sessionId as string);
    res.clearCookie(SESSION_COOKIE, cookieBase);
    res.redirect(303, '/login');
  });
}
