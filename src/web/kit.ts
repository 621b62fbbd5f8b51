import path from 'node:path';
import type { NextFunction, Request, Response } from 'express';
import nunjucks from 'nunjucks';
import { ROOT } from '../core/paths.ts';
import { tokensMatch, type WebSession } from './sessions.ts';

const VIEWS = path.join(ROOT, 'src/web/views');

/** What every page group is given: the one template engine, and the guards in front of its routes. */
export interface PageKit {
  /** Renders a view, with the signed-in user's session (if any) beside the view's own context. */
  render(res: Response, status: number, view: string, ctx?: Record<string, unknown>): void;
  /** Signed-in users only: a GET goes to the login page first, anything else is refused. */
  requireUser(req: Request, res: Response, next: NextFunction): void;
  /** A POST must carry the session's CSRF token. */
  requireCsrf(req: Request, res: Response, next: NextFunction): void;
}

/** "3 h 05 min" between now and `iso` (past or future). */
function span(iso: string): string {
  const minutes = Math.round(Math.abs(Date.parse(iso) - Date.now()) / 60_000);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  return hours < 48
    ? `${hours} h ${String(minutes % 60).padStart(2, '0')} min`
    : `${Math.floor(hours / 24)} days`;
}

export function createPageKit(): PageKit {
  const env = new nunjucks.Environment(new nunjucks.FileSystemLoader(VIEWS), { autoescape: true });
  env.addFilter('span', span);
  env.addFilter('dash', (v: unknown) => (v === null || v === undefined ? '—' : String(v)));

  const render: PageKit['render'] = (res, status, view, ctx = {}) =>
    res
      .status(status)
      .type('html')
      .send(env.render(view, { ...ctx, session: res.locals.session as WebSession | undefined }));

  return {
    render,
    requireUser(req, res, next) {
      if (res.locals.session) return next();
      if (req.method === 'GET')
        return res.redirect(303, `/login?next=${encodeURIComponent(req.originalUrl)}`);
      render(res, 403, 'error.njk', { title: 'Not signed in', message: 'Sign in again, then retry.' });
    },
    requireCsrf(req, res, next) {
      const session = res.locals.session as WebSession;
      if (tokensMatch((req.body as Record<string, unknown> | undefined)?._csrf, session.csrf)) return next();
      render(res, 403, 'error.njk', {
        title: 'Form expired',
        message: 'The form was not accepted. Reload the page and try again.',
      });
    },
  };
}
