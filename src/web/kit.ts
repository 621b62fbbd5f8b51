import path from 'node:path';
import type { NextFunction, Request, Response } from 'express';
import nunjucks from 'nunjucks';
import { ROOT } from '../core/paths.ts';
import { marked, pieces } from '../core/visible.ts';
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

/** A time from a view (ISO text) or a row (Date on pg); nothing for a missing or unreadable one. */
function toDate(value: unknown): Date | undefined {
  if (value === null || value === undefined || value === '') return undefined;
  const t = value instanceof Date ? value : new Date(String(value));
  return Number.isNaN(t.getTime()) ? undefined : t;
}

/** "2026-11-30 09:00 UTC" (with seconds: "2026-11-30 09:00:05 UTC"); what a page says without its script. */
function utc(value: unknown, seconds = false): string {
  const t = toDate(value);
  if (!t) return '—';
  return `${t
    .toISOString()
    .slice(0, seconds ? 19 : 16)
    .replace('T', ' ')} UTC`;
}

/**
 * A time element: the UTC text as the server's fallback and the exact UTC instant as its title; the page's
 * script (static/time.js) rewrites the text to the reader's local time and how far away it is.
 */
function when(value: unknown): nunjucks.runtime.SafeString | string {
  const t = toDate(value);
  if (!t) return '—';
  // Safe to mark up unescaped: an ISO string made here holds only digits, "-", ":", ".", "T" and "Z".
  const iso = t.toISOString();
  return new nunjucks.runtime.SafeString(
    `<time datetime="${iso}" title="${utc(iso, true)}">${utc(iso)}</time>`,
  );
}

/** Escaped as the templates' autoescape escapes (nunjucks' own map), so pages read the same either way. */
const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '"': '&quot;',
  "'": '&#39;',
  '<': '&lt;',
  '>': '&gt;',
  '\\': '&#92;',
};
const escapeHtml = (s: string) => s.replace(/[&"'<>\\]/g, (c) => ESCAPES[c]!);

/**
 * Agent-supplied text as a chair must see it: every invisible or reordering character replaced by a
 * marker naming it, and each line in its own isolated run (`<bdi>`), so no line can reorder another.
 */
function visible(value: unknown): nunjucks.runtime.SafeString | string {
  if (value === null || value === undefined) return '';
  const lines = String(value)
    .split('\n')
    .map((line) => {
      const html = pieces(line)
        .map((p) =>
          'text' in p
            ? escapeHtml(p.text)
            : `<span class="hidden-char" dir="ltr">${escapeHtml(p.marker)}</span>`,
        )
        .join('');
      return `<bdi class="line">${html}</bdi>`;
    });
  // Safe to mark up unescaped: every piece of the text was escaped above.
  return new nunjucks.runtime.SafeString(lines.join('\n'));
}

/** "24 h", "3 days", "90 min": a configured duration as people read it. */
export function duration(seconds: number): string {
  if (seconds % 86_400 === 0 && seconds >= 2 * 86_400) return `${seconds / 86_400} days`;
  if (seconds % 3600 === 0) return `${seconds / 3600} h`;
  if (seconds % 60 === 0) return `${seconds / 60} min`;
  return `${seconds} s`;
}

export function createPageKit(): PageKit {
  const env = new nunjucks.Environment(new nunjucks.FileSystemLoader(VIEWS), { autoescape: true });
  env.addFilter('utc', utc);
  env.addFilter('when', when);
  env.addFilter('duration', duration);
  env.addFilter('visible', visible);
  // For attributes (a title): the markers as text, escaped by the template like any other value.
  env.addFilter('visible_text', (v: unknown) => (v === null || v === undefined ? '' : marked(String(v))));
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
