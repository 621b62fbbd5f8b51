import {
  reviewShowsEverything,
  DECISION_CODE,
  isDecisionRefusal,
  type DecisionRefusal,
} from '../approval/index.ts';
import { z } from 'zod';
import type { Approvals } from '../approval/index.ts';
import type { AuditLog, Refusals } from '../audit/index.ts';
import type { Config, SlackConfig } from '../config.ts';
import type { User } from '../core/identity.ts';
import { isUuid } from '../core/ids.ts';
import type { Logger } from '../log.ts';
import { updateWithOutcome, type SlackApi, type SlackStore } from '../notify/index.ts';
import { mapSlackUser } from './slack-users.ts';
import type { UserDirectory } from '../accounts/index.ts';

/**
 * A decision taken from a Slack callback whose signature already held: who the Slack user is, whether
 * the button showed the request's content, then decide() as the web form calls it. Every refusal is
 * audited (slack.refused) and returned as the words the Slack user is told.
 */

/** Why a Slack callback was refused (audit kind slack.refused, details.reason). */
export type SlackRefusal =
  | 'bad_signature'
  | 'stale_timestamp'
  | 'replayed'
  | 'bad_payload'
  | 'unmapped_user'
  | 'lookup_failed'
  | 'content_mismatch'
  | 'not_shown_in_full'
  | DecisionRefusal;

const REFUSAL_CODE = {
  bad_signature: 'UNAUTHENTICATED',
  stale_timestamp: 'UNAUTHENTICATED',
  replayed: 'UNAUTHENTICATED',
  bad_payload: 'INVALID_ARGUMENT',
  unmapped_user: 'PERMISSION_DENIED',
  lookup_failed: 'SOURCE_UNAVAILABLE',
  content_mismatch: 'CONFLICT',
  not_shown_in_full: 'CONFLICT',
  ...DECISION_CODE,
} as const satisfies Record<SlackRefusal, string>;

/** What a button names: the request and the content hash its message showed. */
export const Target = z.object({ id: z.string(), sha256: z.string() });
export type Target = z.infer<typeof Target>;

export interface SlackPageDeps {
  /** Who a Slack user is among the active users (accounts'). */
  people: UserDirectory;
  /** The Slack app's messages and the signed callbacks seen (a replay is refused on every replica). */
  slackStore: SlackStore;
  audit: AuditLog;
  /** Where callbacks refused before anyone is known are counted (auth.denied_summary past a few a minute). */
  refusals: Refusals;
  approvals: Approvals;
  config: Config;
  log: Logger;
}

export interface Ctx extends SlackPageDeps {
  api: SlackApi;
  slack: SlackConfig;
  ip: string;
}

/** What a refusal's audit row says besides its reason. */
export interface RefusalFacts {
  slack_user?: string;
  actor?: string;
  action?: string;
  target?: Target;
  message?: string;
  email?: string;
}

/**
 * A callback refused before it was known to come from Slack (unsigned, stale, replayed, unreadable): its
 * row, unless the address sent its share of those this minute; then it is counted into the minute's
 * auth.denied_summary.
 */
export async function countRefusal(ctx: Ctx, reason: SlackRefusal): Promise<void> {
  await ctx.refusals.record(ctx.ip, refusalRow(ctx, reason));
}

export async function auditRefusal(ctx: Ctx, reason: SlackRefusal, f: RefusalFacts = {}): Promise<void> {
  await ctx.audit.append(refusalRow(ctx, reason, f));
}

function refusalRow(ctx: Ctx, reason: SlackRefusal, f: RefusalFacts = {}) {
  const id = f.target && isUuid(f.target.id) ? f.target.id : null;
  return {
    kind: 'slack.refused',
    actor: f.actor ?? null,
    approval_request_id: id,
    content_sha256: f.target?.sha256 ?? null,
    result: 'error',
    error_code: REFUSAL_CODE[reason],
    details: {
      reason,
      ip: ctx.ip,
      ...(f.slack_user ? { slack_user: f.slack_user } : {}),
      ...(f.action ? { action: f.action } : {}),
      ...(f.email ? { slack_email: f.email } : {}),
      ...(f.message ? { message: f.message } : {}),
    },
  } as const;
}

/** A failure nobody waits for (the answer went out already): logged. */
export function fail(ctx: Ctx, err: unknown) {
  ctx.log.error({ err }, 'a Slack callback failed');
}

/**
 * Who may decide through this callback, and on what: the mapped user, and the request if it holds the
 * content the message showed. A refusal is audited and its message returned.
 */
export async function admit(
  ctx: Ctx,
  slackUser: string,
  target: Target,
  action: string,
): Promise<{ user: User } | { refusal: string }> {
  const mapped = await mapSlackUser(ctx, slackUser);
  if ('refused' in mapped) {
    await auditRefusal(ctx, mapped.refused, { slack_user: slackUser, action, target, email: mapped.email });
    return { refusal: mapped.message };
  }
  const facts = { slack_user: slackUser, actor: mapped.user.name, action, target };
  const request = await ctx.approvals.showForReview(target.id);
  if (!request) {
    await auditRefusal(ctx, 'not_found', facts);
    return { refusal: 'There is no such approval request.' };
  }
  if (request.content_sha256 !== target.sha256) {
    await auditRefusal(ctx, 'content_mismatch', facts);
    return { refusal: 'This message showed other content than the request holds: nothing was decided.' };
  }
  // A message that cannot show all of a request offers no Approve; a click on one posted before is refused.
  if (action === 'approve' && !reviewShowsEverything(request.review)) {
    await auditRefusal(ctx, 'not_shown_in_full', facts);
    return {
      refusal: 'Slack cannot show all of this request: read it on the review page and decide there.',
    };
  }
  return mapped;
}

/** A decision through decide(), as the web form takes it; the message is updated once it is final. */
export async function decideFor(
  ctx: Ctx,
  opts: {
    user: User;
    slackUser: string;
    target: Target;
    decision: 'approve' | 'reject';
    note: string | null;
  },
): Promise<{ ok: string } | { refusal: string }> {
  const { user, target, decision } = opts;
  try {
    const view = await ctx.approvals.decide({ id: target.id, user, decision, note: opts.note });
    if (view.status === 'pending') {
      return { ok: `Your approval is recorded: ${view.approvers.length} of ${view.required_approvers}.` };
    }
    const by = view.status === 'approved' ? view.approvers.join(', ') : user.name;
    await updateWithOutcome({ store: ctx.slackStore, api: ctx.api }, target.id, {
      status: view.status,
      by,
      note: view.note,
    }).catch((err: unknown) => fail(ctx, err));
    return { ok: `Done: the request is ${view.status}.` };
  } catch (err) {
    if (!isDecisionRefusal(err)) throw err;
    const facts = {
      slack_user: opts.slackUser,
      actor: user.name,
      action: decision,
      target,
      message: err.message,
    };
    await auditRefusal(ctx, err.reason, facts);
    return { refusal: `Not decided: ${err.message}.` };
  }
}
