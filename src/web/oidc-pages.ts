import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
import type { CookieOptions, Request, Response, Router } from 'express';
import { z } from 'zod';
import {
  createOidcClient,
  OIDC_FAILURE_PAGE,
  OidcAttempt,
  type OidcClient,
  type OidcRefusal,
  identityOf,
  SIGN_IN_WINDOW_MINUTES,
  type SignIn,
} from '../accounts/index.ts';
import type { AuditLog, Refusals } from '../audit/index.ts';
import { publicBaseUrl, type Config } from '../config.ts';
import type { Logger } from '../log.ts';
import type { PageKit } from './kit.ts';
import { safeNext } from './login-pages.ts';
import { readCookies, SESSION_COOKIE, type SessionStore } from './sessions.ts';

const ATTEMPT_COOKIE = 'cs_oidc';
/** How long a person has at the provider to sign in before the attempt is void. */
const ATTEMPT_MS = 10 * 60 * 1000;

export interface OidcPageDeps {
  /** The attempts' limits, the users single sign-on finds or creates, and the attempts' sealing secret. */
  signIn: SignIn;
  audit: AuditLog;
  /** Where refusals are recorded: a few rows per address and reason a minute, the rest counted. */
  refusals: Refusals;
  config: Config;
  sessions: SessionStore;
  log: Logger;
}

/** The attempt as the browser keeps it: sealed (AES-256-GCM), so it can be neither read nor altered. */
const Sealed = OidcAttempt.extend({ next: z.string(), expires: z.number() });
type Sealed = z.infer<typeof Sealed>;

function seal(key: Buffer, value: Sealed): string {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', key, iv).setAAD(Buffer.from(ATTEMPT_COOKIE));
  const body = Buffer.concat([cipher.update(JSON.stringify(value), 'utf8'), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64url');
}

/** The attempt in a cookie, if it was sealed here and has not expired; anything else is no attempt. */
function unseal(key: Buffer, text: string | undefined): Sealed | undefined {
  if (!text || text.length > 4096) return undefined;
  try {
    const raw = Buffer.from(text, 'base64url');
    const decipher = createDecipheriv('aes-256-gcm', key, raw.subarray(0, 12))
      .setAAD(Buffer.from(ATTEMPT_COOKIE))
      .setAuthTag(raw.subarray(12, 28));
    const plain = Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString('utf8');
    const sealed = Sealed.parse(JSON.parse(plain));
    return sealed.expires > Date.now() ? sealed : undefined;
  } catch {
    return undefined;
  }
}

/** The key attempts are sealed with: one for every replica, so that any can finish an attempt another began. */
function sealingKey(signIn: SignIn): () => Promise<Buffer> {
  let key: Promise<Buffer> | undefined;
  return () =>
    (key ??= signIn.oidcAttemptSecret().then((secret) => createHash('sha256').update(secret).digest()));
}

/** Where to go after sign-in: a path on this origin (safeNext), but never back into a sign-in. */
function nextAfter(raw: unknown, redirectPath: string): string {
  const next = safeNext(raw);
  return /^\/login(\/|\?|$)/.test(next) || next.split('?')[0] === redirectPath ? '/approvals' : next;
}

type Refusal = OidcRefusal & { name?: string; subject?: string };

/**
 * A refusal's page (error.njk, with the reason) and its user.login_failed row (past a few a minute from
 * one address for one reason, counted into the minute's auth.denied_summary); never a session.
 */
function refusalPage(kit: PageKit, refusals: Refusals, issuer: string) {
  return async (req: Request, res: Response, refusal: Refusal) => {
    const [status, title, words] = OIDC_FAILURE_PAGE[refusal.failure];
    const ip = req.socket.remoteAddress ?? 'unknown';
    await refusals.record(ip, {
      kind: 'user.login_failed',
      actor: refusal.name ?? null,
      result: 'error',
      details: {
        ip,
        via: 'oidc',
        issuer,
        reason: refusal.failure,
        ...(refusal.error ? { error: refusal.error } : {}),
        ...(refusal.subject ? { subject: refusal.subject } : {}),
      },
    });
    if (status === 503) res.set('Retry-After', '30');
    kit.render(res, status, 'error.njk', { title, message: `${words} (reason: ${refusal.failure})` });
  };
}

/**
 * Single sign-on (config `web.oidc`, docs/identity.md): GET /login/oidc sends the browser to the provider
 * with a fresh attempt sealed in a short-lived cookie; the provider sends it back to the redirect path,
 * where the answer is checked against that attempt, the person is found or created, and a web session
 * begins exactly as after a password sign-in. Every refusal is a page and a user.login_failed row.
 */
export function mountOidcPages(router: Router, kit: PageKit, deps: OidcPageDeps): void {
  const config = deps.config.web.oidc;
  if (!config) return;
  const oidc: OidcClient = createOidcClient(config, {
    redirectUri: new URL(config.redirect_path, publicBaseUrl(deps.config)).href,
    log: deps.log,
  });
  const key = sealingKey(deps.signIn);
  const refuse = refusalPage(kit, deps.refusals, config.issuer);
  const secure = deps.config.web.secure_cookies;
  // Lax, not Strict: the provider's redirect back is a cross-site navigation, which must carry it.
  const attemptCookie: CookieOptions = {
    httpOnly: true,
    sameSite: 'lax',
    secure,
    path: config.redirect_path,
  };

  router.get('/login/oidc', async (req, res) => {
    const begun = await oidc.begin();
    if ('failure' in begun) return refuse(req, res, begun);
    const next = nextAfter(req.query.next, config.redirect_path);
    const sealed = seal(await key(), { ...begun.attempt, next, expires: Date.now() + ATTEMPT_MS });
    res.cookie(ATTEMPT_COOKIE, sealed, { ...attemptCookie, maxAge: ATTEMPT_MS });
    res.redirect(303, begun.url.href);
  });

  router.get(config.redirect_path, async (req, res) => {
    // One answer per attempt: the cookie goes whatever the outcome, so a replayed callback finds none.
    res.clearCookie(ATTEMPT_COOKIE, attemptCookie);
    // Any web page can make a browser call this address, so its refusals are limited per address, in a
    // bucket of their own: they never lock out anyone's password (docs/identity.md).
    const origin = req.socket.remoteAddress ?? 'unknown';
    const reserved = await deps.signIn.reserve({ bucket: 'oidc_callback', origin });
    if (reserved === undefined) {
      // Over the limit is a refusal too: counted like the others (a few rows a minute, then the summary).
      await deps.refusals.record(origin, {
        kind: 'user.login_failed',
        actor: null,
        result: 'error',
        details: { ip: origin, via: 'oidc', issuer: config.issuer, reason: 'too_many_attempts' },
      });
      res.set('Retry-After', String(SIGN_IN_WINDOW_MINUTES * 60));
      return kit.render(res, 429, 'error.njk', {
        title: 'Too many sign-ins',
        message: `Too many single sign-ons failed from this address. Wait ${SIGN_IN_WINDOW_MINUTES} minutes, then try again. (reason: too_many_attempts)`,
      });
    }
    const refuseCounted = async (refusal: Parameters<typeof refuse>[2]) => {
      // The provider being unreachable is no fault of the caller's: that refusal does not count.
      if (OIDC_FAILURE_PAGE[refusal.failure][0] === 503) await deps.signIn.release(reserved);
      return refuse(req, res, refusal);
    };
    const attempt = unseal(await key(), readCookies(req.get('cookie'))[ATTEMPT_COOKIE]);
    if (!attempt) return refuseCounted({ failure: 'no_attempt' });
    // The answer as sent to the registered redirect URI, whatever Host the request came through.
    const callback = new URL(oidc.redirectUri);
    callback.search = new URL(req.originalUrl, callback).search;
    const answer = await oidc.finish(callback, attempt);
    if ('failure' in answer) return refuseCounted(answer);
    const identity = identityOf(config, answer.claims);
    const outcome = await deps.signIn.withOidc(identity);
    if ('failure' in outcome) return refuseCounted({ ...outcome, subject: identity.subject });

    const { user } = outcome;
    await deps.signIn.release(reserved);
    const created = await deps.sessions.create(user);
    await deps.sessions.destroy(res.locals.sessionId as string | undefined);
    await deps.audit.append({
      kind: 'user.login',
      actor: user.name,
      result: 'ok',
      details: {
        ip: req.socket.remoteAddress ?? 'unknown',
        via: 'oidc',
        issuer: config.issuer,
        subject: identity.subject,
      },
    });
    res.cookie(SESSION_COOKIE, created.id, { httpOnly: true, sameSite: 'strict', secure, path: '/' });
    // A page of this site moves on, not a redirect: this request arrived from the provider's site, and
    // some browsers withhold SameSite=Strict cookies all along a redirect chain that began elsewhere.
    res.set('Refresh', `0; url=${attempt.next.replace(/['"]/g, encodeURIComponent)}`);
    kit.render(res, 200, 'oidc-continue.njk', { name: user.name, label: config.label, next: attempt.next });
  });
}
