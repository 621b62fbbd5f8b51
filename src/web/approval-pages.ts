import type { Response, Router } from 'express';
import { describeRequirement, isDecisionRefusal, requirementOf, type Approvals } from '../approval/index.ts';
import { ApprovalStatus } from '../core/schemas.ts';
import { HTTP_STATUS } from '../core/errors.ts';
import { countHiddenIn } from '../core/visible.ts';
import type { Config } from '../config.ts';
import type { BlobStore } from '../connectors/index.ts';
import { duration, type PageKit } from './kit.ts';
import type { WebSession } from './sessions.ts';
import { storedToolName, withAgentToolName } from '../core/tool-names.ts';

const PAGE_SIZE = 25;
const PREVIEW_BYTES = 64 * 1024;

export interface ApprovalPageDeps {
  approvals: Approvals;
  blobs: BlobStore;
  config: Config;
}

/**
 * The chair's pages: the queue of approval requests, one request's review form, and its decision. Any
 * signed-in user may look; only a chair may decide, and approval/ enforces that, not the form.
 */
export function mountApprovalPages(router: Router, kit: PageKit, deps: ApprovalPageDeps): void {
  const detail = showRequest(kit, deps);
  const prefix = deps.config.tools.prefix;

  router.get('/', (_req, res) => res.redirect(303, '/approvals'));
  router.get('/approvals', kit.requireUser, async (req, res) => {
    const status = ApprovalStatus.safeParse(req.query.status ?? 'pending');
    const tool = typeof req.query.tool === 'string' ? req.query.tool.trim() : '';
    const filter = {
      status: status.success ? status.data : 'pending',
      // Typed as agents call it (isphere_send_message) or as requests store it (send_message).
      tool: tool ? storedToolName(tool, prefix) : undefined,
      agent: typeof req.query.agent === 'string' && req.query.agent ? req.query.agent : undefined,
      mine: req.query.mine === '1',
    } as const;
    const { user } = res.locals.session as WebSession;
    // "Waiting for me": pending requests this user can decide now (approval/ says which).
    const waiting_for = filter.mine ? { id: user.id, name: user.name } : undefined;
    const page = Math.max(1, Math.min(10_000, Number.parseInt(String(req.query.page ?? '1'), 10) || 1));
    const [rows, counts] = await Promise.all([
      deps.approvals.listForReview({
        ...filter,
        waiting_for,
        limit: PAGE_SIZE + 1,
        offset: (page - 1) * PAGE_SIZE,
      }),
      deps.approvals.countByStatus(filter),
    ]);
    const query = (p: number) =>
      new URLSearchParams({
        status: filter.status,
        tool: filter.tool ?? '',
        agent: filter.agent ?? '',
        ...(filter.mine ? { mine: '1' } : {}),
        page: String(p),
      }).toString();
    kit.render(res, 200, 'queue.njk', {
      rows: rows.slice(0, PAGE_SIZE).map((r) => withAgentToolName(r, prefix)),
      counts,
      statuses: ApprovalStatus.options,
      filter: { ...filter, tool: tool || undefined },
      toolPlaceholder: `${prefix}send_message`,
      page,
      prev: page > 1 ? `/approvals?${query(page - 1)}` : null,
      next: rows.length > PAGE_SIZE ? `/approvals?${query(page + 1)}` : null,
    });
  });

  router.get('/admin/policy', kit.requireUser, async (_req, res) => {
    const { roles } = (res.locals.session as WebSession).user;
    if (!roles.includes('admin') && !roles.includes('compliance'))
      return kit.render(res, 403, 'error.njk', {
        title: 'Not allowed',
        message: 'The approval policy is shown to admin and compliance users.',
      });
    const policy = await deps.approvals.policy.fresh();
    kit.render(res, 200, 'policy.njk', {
      version: policy.version,
      origin: await deps.approvals.policy.origin(),
      tampered: policy.tampered === true,
      policy: policy.doc,
      rules: policy.doc.rules.map((r) => ({ ...r, asks: describeRequirement(requirementOf(r)) })),
    });
  });

  router.get('/approvals/:id', kit.requireUser, async (req, res) => {
    const done = typeof req.query.done === 'string' ? req.query.done : undefined;
    await detail(res, String(req.params.id), 200, { done });
  });

  router.post('/approvals/:id/decision', kit.requireUser, kit.requireCsrf, async (req, res) => {
    const session = res.locals.session as WebSession;
    const id = String(req.params.id);
    const body = req.body as Record<string, string | undefined>;
    const decision = body.decision === 'approve' || body.decision === 'reject' ? body.decision : undefined;
    if (!decision) return detail(res, id, 400, { error: 'Choose approve or reject.' });
    try {
      const view = await deps.approvals.decide({ id, user: session.user, decision, note: body.note ?? null });
      res.redirect(303, `/approvals/${view.approval_request_id}?done=${view.status}`);
    } catch (err) {
      if (!isDecisionRefusal(err)) throw err;
      if (err.reason === 'not_found') return detail(res, id, 404);
      await detail(res, id, HTTP_STATUS[err.code], { error: err.message, note: body.note ?? '' });
    }
  });
}

/** One request's review page: the exact content, a preview of a small text file, the decision form. */
function showRequest(kit: PageKit, deps: ApprovalPageDeps) {
  return async (res: Response, id: string, status = 200, extra: Record<string, unknown> = {}) => {
    const session = res.locals.session as WebSession;
    const request = await deps.approvals.showForReview(id, session.user.name);
    if (!request)
      return kit.render(res, 404, 'error.njk', {
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
      preview = (await deps.blobs.read(sha))?.toString('utf8') ?? null;
    }
    const { target_flags: flags, ...shown } = review;
    const text = typeof review.content_text === 'string' ? review.content_text : undefined;
    const open = session.user.roles.includes('chair') && request.status === 'pending';
    kit.render(res, status, 'detail.njk', {
      request: withAgentToolName(request, deps.config.tools.prefix),
      review,
      ttl: {
        pending: duration(deps.config.approval.pending_ttl_s),
        execute: duration(deps.config.approval.execute_ttl_s),
      },
      preview,
      flags,
      // How long the message is, said beside the buttons (its text follows them in full).
      ask: text === undefined ? null : { chars: Array.from(text).length, lines: text.split('\n').length },
      // Every agent-supplied string the page shows, counted before any of it (the markers are below).
      hidden: countHiddenIn([request.target.target_id, request.target.display_name, shown, preview]),
      canDecide: open && request.viewer?.may !== false,
      // A chair the request's approval rule does not name sees why, and no form.
      readOnly: open && request.viewer?.may === false ? request.viewer.reason : null,
      ...extra,
    });
  };
}
