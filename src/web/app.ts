import path from 'node:path';
import express, { type NextFunction, type Request, type Response } from 'express';
import helmet from 'helmet';
import type { Approvals } from '../approval/index.ts';
import type { AuditReader, Checkpointer, AuditLog, ExportRecords, Refusals } from '../audit/index.ts';
import type { Config } from '../config.ts';
import type { SignIn } from '../accounts/index.ts';
import type { BlobStore } from '../connectors/index.ts';
import type { Logger } from '../log.ts';
import { ROOT } from '../core/paths.ts';
import { hostGuard } from '../server/index.ts';
import { sendProblem } from '../core/problem.ts';
import { mountAccountPages } from './account-pages.ts';
import type { RunCommand } from './account-kit.ts';
import { mountApprovalPages } from './approval-pages.ts';
import { mountAuditPages } from './audit-pages.ts';
import { createPageKit, type PageKit } from './kit.ts';
import { mountLoginPages } from './login-pages.ts';
import { mountOidcPages } from './oidc-pages.ts';
import { loadSession, type SessionStore } from './sessions.ts';
import { slackInteractions } from './slack-pages.ts';
import type { UserDirectory } from '../accounts/index.ts';
import type { SlackStore } from '../notify/index.ts';

const STATIC = path.join(ROOT, 'src/web/static');

export interface WebDeps {
  /** The people's sessions (accounts'): the cookie names one. */
  sessions: SessionStore;
  /** Who a Slack user is among the active users (accounts'). */
  people: UserDirectory;
  /** The Slack app's messages and signed callbacks seen (notify's). */
  slackStore: SlackStore;
  checkpoints: Checkpointer;
  audit: AuditLog;
  /** The log as the compliance pages read it, and the record of their exports. */
  auditReader: AuditReader;
  auditExports: ExportRecords;
  /** Password and single sign-on sign-ins, with their limits. */
  signIn: SignIn;
  /** Refusals of requests from nobody known yet: a few rows per address and reason a minute, then counted. */
  refusals: Refusals;
  approvals: Approvals;
  blobs: BlobStore;
  config: Config;
  log: Logger;
  /** The operator commands (src/admin/commands.ts), for the admin's account pages. */
  commands: RunCommand;
}

/**
 * The people's pages: login, the chair's approval queue and review form, the compliance pages.
 * Server-rendered with an auto-escaping template engine, no JavaScript, CSRF token on every POST, no
 * state change on GET.
 */
export function createWebRouter(deps: WebDeps) {
  const kit = createPageKit();
  const { sessions } = deps;
  const router = express.Router();

  router.use(hostGuard(deps.config, { sameOrigin: true }));
  router.use(securityHeaders(deps.config));
  router.use('/static', express.static(STATIC, { fallthrough: false, index: false }));
  // Browsers ask for /favicon.ico whatever the page says: the same icon the pages link to.
  router.get('/favicon.ico', (_req, res) => {
    res.type('image/svg+xml').set('Cache-Control', 'public, max-age=86400');
    res.sendFile(path.join(STATIC, 'favicon.svg'));
  });
  // Before the form parser: Slack's signature covers the raw body, which only this route reads.
  const slack = deps.config.notifications.slack;
  if (slack) router.post('/slack/interactions', ...slackInteractions(deps, slack));
  router.use(express.urlencoded({ extended: false, limit: '128kb' }));
  router.use(loadSession(sessions));

  mountLoginPages(router, kit, { signIn: deps.signIn, audit: deps.audit, config: deps.config, sessions });
  mountOidcPages(router, kit, {
    signIn: deps.signIn,
    refusals: deps.refusals,
    audit: deps.audit,
    config: deps.config,
    sessions,
    log: deps.log,
  });
  mountApprovalPages(router, kit, { approvals: deps.approvals, blobs: deps.blobs, config: deps.config });
  mountAuditPages(router, kit, {
    reader: deps.auditReader,
    exports: deps.auditExports,
    checkpoints: deps.checkpoints,
    config: deps.config,
  });
  mountAccountPages(router, kit, { run: deps.commands, config: deps.config });
  router.use(errorPage(kit, deps.log));

  return router;
}

function securityHeaders(config: Config) {
  return helmet({
    contentSecurityPolicy: {
      useDefaults: false,
      directives: {
        defaultSrc: ["'none'"],
        styleSrc: ["'self'"],
        // Only the page scripts served from /static (time.js): no inline script, no other origin.
        scriptSrc: ["'self'"],
        imgSrc: ["'self'"],
        formAction: ["'self'"],
        frameAncestors: ["'none'"],
        baseUri: ["'none'"],
      },
    },
    strictTransportSecurity: config.web.secure_cookies,
    // same-origin, not no-referrer: with no-referrer browsers send "Origin: null" on form posts,
    // and the Origin check (DNS-rebinding and CSRF defence) needs the real origin.
    referrerPolicy: { policy: 'same-origin' },
  });
}

/**
 * A page, not a stack trace: a form too large is the user's to fix; a file under /static that is not
 * there is the same 404 as any unknown path (and its absolute path goes nowhere); anything else is logged.
 */
function errorPage(kit: PageKit, log: Logger) {
  return (err: Error, _req: Request, res: Response, next: NextFunction) => {
    if ((err as { type?: string }).type === 'entity.too.large') {
      return kit.render(res, 413, 'error.njk', { title: 'Too large', message: 'The form was too large.' });
    }
    if (res.headersSent) return next(err);
    // express.static's refusals (a missing file, a dotfile, a malformed path) carry their 4xx status.
    const status = (err as { status?: unknown }).status;
    if (typeof status === 'number' && status >= 400 && status < 500) {
      return sendProblem(
        res,
        status === 404
          ? { code: 'NOT_FOUND', reason: 'not_found', title: 'Not found' }
          : { code: 'INVALID_ARGUMENT', reason: 'bad_request', title: 'Bad request', status },
      );
    }
    log.error({ err }, 'web page failed');
    kit.render(res, 500, 'error.njk', { title: 'Something went wrong', message: 'The error was logged.' });
  };
}
