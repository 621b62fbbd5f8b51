import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import express, { type NextFunction, type Request, type Response } from 'express';
import helmet from 'helmet';
import type { Knex } from 'knex';
import nunjucks from 'nunjucks';
import { DecisionError, type DecisionRefusal } from '../approval/decide.ts';
import type { Approvals } from '../approval/index.ts';
import { ApprovalStatus } from '../approval/view.ts';
import type { CheckpointDeps } from '../audit/checkpoints.ts';
import type { AuditLog } from '../audit/log.ts';
import type { Config } from '../config.ts';
import type { BlobStore } from '../connectors/local/blobs.ts';
import type { Logger } from '../log.ts';
import { hostGuard } from '../server/http.ts';
import { checkCredentials } from '../accounts/users.ts';
import { mountAuditPages } from './audit-pages.ts';
import { loginBlocked } from './login-limit.ts';
import { createSessionStore, readCookies, SESSION_COOKIE, tokensMatch, type WebSession } from './sessions.ts';

const VIEWS = fileURLToPath(new URL('./views', import.meta.url));
const STATIC = fileURLToPath(new URL('./static', import.meta.url));
const LOGIN_COOKIE = 'cs_login';
const PAGE_SIZE = 25;
const PREVIEW_BYTES = 64 * 1024;

export interface WebDeps {
  knex: Knex;
  checkpoints: CheckpointDeps;
  audit: AuditLog;
  approvals: Approvals;
  blobs: BlobStore;
  config: Config;
  log: Logger;
}

const STATUS_CODE: Record<DecisionRefusal, number> = {
  not_found: 404,
  not_chair: 403,
  owner_of_agent: 403,
  note_required: 400,
  not_pending: 409,
  expired: 409,
  already_decided: 409,
};

/** "3 h 05 min" between now and `iso` (past or future). */
function span(iso: string): string {
  const minutes = Math.round(Math.abs(Date.parse(iso) - Date.now()) / 60_000);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  return hours < 48
    ? `${hours} h ${String(minutes % 60).padStart(2, '0')} min`
    : `${Math.floor(hours / 24)} days`;
}

/** Only same-site paths of the approvals pages are followed after login (no open redirect). */
function safeNext(next: unknown): string {
  return typeof next === 'string' && /^\/approvals(\/[0-9a-f-]{36})?(\?[\w=&%.-]*)?$/i.test(next)
    ? next
    : '/approvals';
}

/**
 * The people's pages: login, the chair's approval queue and review form. Server-rendered with an
 * auto-escaping template engine, no JavaScript, CSRF token on every POST, no state change on GET.
 */
export function createWebRouter(deps: WebDeps) {
  const env = new nunjucks.Environment(new nunjucks.FileSystemLoader(VIEWS), { autoescape: true });
  env.addFilter('span', span);
  env.addFilter('dash', (v: unknown) => (v === null || v === undefined ? '—' : String(v)));
  const sessions = createSessionStore(deps.knex, deps.config);
  const cookieBase = {
    httpOnly: true,
    sameSite: 'strict' as const,
    secure: deps.config.web.secure_cookies,
    path: '/',
  };
  const router = express.Router();

  const render = (res: Response, status: number, view: string, ctx: Record<string, unknown> = {}) =>
    res
      .status(status)
      .type('html')
      .send(env.render(view, { ...ctx, session: res.locals.session as WebSession | undefined }));

  router.use(hostGuard(deps.config));
  router.use(
    helmet({
      contentSecurityPolicy: {
        useDefaults: false,
        directives: {
          defaultSrc: ["'none'"],
          styleSrc: ["'self'"],
          imgSrc: ["'self'"],
          formAction: ["'self'"],
          frameAncestors: ["'none'"],
          baseUri: ["'none'"],
        },
      },
      strictTransportSecurity: deps.config.web.secure_cookies,
      // same-origin, not no-referrer: with no-referrer browsers send "Origin: null" on form posts,
      // and the Origin check (DNS-rebinding and CSRF defence) needs the real origin.
      referrerPolicy: { policy: 'same-origin' },
    }),
  );
  router.use('/static', express.static(STATIC, { fallthrough: false, index: false }));
  router.use(express.urlencoded({ extended: false, limit: '128kb' }));

  router.use(async (req: Request, res: Response, next: NextFunction) => {
    res.locals.sessionId = readCookies(req.get('cookie'))[SESSION_COOKIE];
    res.locals.session = await sessions.load(res.locals.sessionId as string | undefined);
    res.set('Cache-Control', 'no-store');
    next();
  });

  const requireUser = (req: Request, res: Response, next: NextFunction) => {
    if (res.locals.session) return next();
    if (req.method === 'GET') return res.redirect(303, `/login?next=${encodeURIComponent(req.originalUrl)}`);
    render(res, 403, 'error.njk', { title: 'Not signed in', message: 'Sign in again, then retry.' });
  };
  const requireCsrf = (req: Request, res: Response, next: NextFunction) => {
    const session = res.locals.session as WebSession;
    if (tokensMatch((req.body as Record<string, unknown> | undefined)?._csrf, session.csrf)) return next();
    render(res, 403, 'error.njk', {
      title: 'Form expired',
      message: 'The form was not accepted. Reload the page and try again.',
    });
  };

  router.get('/', (_req, res) => res.redirect(303, '/approvals'));

  router.get('/login', (req, res) => {
    const token = randomBytes(24).toString('base64url');
    res.cookie(LOGIN_COOKIE, token, { ...cookieBase, path: '/login', maxAge: 30 * 60 * 1000 });
    render(res, 200, 'login.njk', { csrf: token, next: safeNext(req.query.next) });
  });

  router.post('/login', async (req, res) => {
    const body = req.body as Record<string, string | undefined>;
    const name = String(body.name ?? '').trim();
    const next = safeNext(body.next);
    const ip = req.socket.remoteAddress ?? 'unknown';
    const again = (status: number, error: string) => {
      const token = randomBytes(24).toString('base64url');
      res.cookie(LOGIN_COOKIE, token, { ...cookieBase, path: '/login', maxAge: 30 * 60 * 1000 });
      render(res, status, 'login.njk', { csrf: token, next, error, name });
    };
    if (!tokensMatch(body._csrf, readCookies(req.get('cookie'))[LOGIN_COOKIE] ?? '')) {
      return again(403, 'The sign-in form expired. Please try again.');
    }
    const limits = {
      perUser: deps.config.web.login_failures_per_user,
      perIp: deps.config.web.login_failures_per_ip,
    };
    if (await loginBlocked(deps.knex, { name, ip, ...limits })) {
      res.set('Retry-After', '900');
      return again(429, 'Too many failed sign-ins. Wait 15 minutes, then try again.');
    }
    const user = name ? await checkCredentials(deps.knex, name, String(body.password ?? '')) : undefined;
    if (!user) {
      await deps.audit.append({
        kind: 'user.login_failed',
        actor: name.slice(0, 64) || null,
        result: 'error',
        details: { ip },
      });
      return again(401, 'Wrong user name or password.');
    }
    const created = await sessions.create(user);
    await sessions.destroy(res.locals.sessionId as string | undefined);
    await deps.audit.append({ kind: 'user.login', actor: user.name, result: 'ok', details: { ip } });
    res.clearCookie(LOGIN_COOKIE, { ...cookieBase, path: '/login' });
    res.cookie(SESSION_COOKIE, created.id, cookieBase);
    res.redirect(303, next);
  });

  router.post('/logout', requireUser, requireCsrf, async (_req, res) => {
    await sessions.destroy(res.locals.sessionId as string);
    res.clearCookie(SESSION_COOKIE, cookieBase);
    res.redirect(303, '/login');
  });

  router.get('/approvals', requireUser, async (req, res) => {
    const status = ApprovalStatus.safeParse(req.query.status ?? 'pending');
    const filter = {
      status: status.success ? status.data : 'pending',
      tool: typeof req.query.tool === 'string' && req.query.tool ? req.query.tool : undefined,
      agent: typeof req.query.agent === 'string' && req.query.agent ? req.query.agent : undefined,
    } as const;
    const page = Math.max(1, Math.min(10_000, Number.parseInt(String(req.query.page ?? '1'), 10) || 1));
    const [rows, counts] = await Promise.all([
      deps.approvals.listForReview({ ...filter, limit: PAGE_SIZE + 1, offset: (page - 1) * PAGE_SIZE }),
      deps.approvals.countByStatus(filter),
    ]);
    const query = (p: number) =>
      new URLSearchParams({
        status: filter.status,
        tool: filter.tool ?? '',
        agent: filter.agent ?? '',
        page: String(p),
      }).toString();
    render(res, 200, 'queue.njk', {
      rows: rows.slice(0, PAGE_SIZE),
      counts,
      statuses: ApprovalStatus.options,
      filter,
      page,
      prev: page > 1 ? `/approvals?${query(page - 1)}` : null,
      next: rows.length > PAGE_SIZE ? `/approvals?${query(page + 1)}` : null,
    });
  });

  async function detail(res: Response, id: string, status = 200, extra: Record<string, unknown> = {}) {
    const request = await deps.approvals.showForReview(id);
    if (!request)
      return render(res, 404, 'error.njk', {
        title: 'Not found',
        message: 'There is no such approval request.',
      });
    const review = request.review as Record<string, unknown>;
    let preview: string | null = null;
    const sha = review.file_sha256;
    if (
      typeof sha === 'string' &&
      /^text\/|json$/.test(String(review.mime_type)) &&
      Number(review.file_size_bytes) <= PREVIEW_BYTES
    ) {
      preview = await fs.promises.readFile(deps.blobs.pathOf(sha), 'utf8').catch(() => null);
    }
    const session = res.locals.session as WebSession;
    render(res, status, 'detail.njk', {
      request,
      review,
      preview,
      canDecide: session.user.roles.includes('chair') && request.status === 'pending',
      ...extra,
    });
  }

  router.get('/approvals/:id', requireUser, async (req, res) => {
    const done = typeof req.query.done === 'string' ? req.query.done : undefined;
    await detail(res, String(req.params.id), 200, { done });
  });

  router.post('/approvals/:id/decision', requireUser, requireCsrf, async (req, res) => {
    const session = res.locals.session as WebSession;
    const id = String(req.params.id);
    const body = req.body as Record<string, string | undefined>;
    const decision = body.decision === 'approve' || body.decision === 'reject' ? body.decision : undefined;
    if (!decision) return detail(res, id, 400, { error: 'Choose approve or reject.' });
    try {
      const view = await deps.approvals.decide({ id, user: session.user, decision, note: body.note ?? null });
      res.redirect(303, `/approvals/${view.approval_request_id}?done=${view.status}`);
    } catch (err) {
      if (!(err instanceof DecisionError)) throw err;
      if (err.reason === 'not_found') return detail(res, id, 404);
      await detail(res, id, STATUS_CODE[err.reason], { error: err.message, note: body.note ?? '' });
    }
  });

  mountAuditPages(router, {
    services: { knex: deps.knex, checkpoints: deps.checkpoints, config: deps.config },
    render,
    requireUser,
    requireCsrf,
  });

  router.use((err: Error, _req: Request, res: Response, next: NextFunction) => {
    if ((err as { type?: string }).type === 'entity.too.large') {
      return render(res, 413, 'error.njk', { title: 'Too large', message: 'The form was too large.' });
    }
    if (res.headersSent) return next(err);
    deps.log.error({ err }, 'web page failed');
    render(res, 500, 'error.njk', { title: 'Something went wrong', message: 'The error was logged.' });
  });

  return router;
}
