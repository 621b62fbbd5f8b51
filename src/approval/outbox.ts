import canonicalize from 'canonicalize';
import type { Config, NotificationEvent } from '../config.ts';
import { countHiddenIn, marked } from '../core/visible.ts';
import type { Delivery } from './store/guarded.ts';
import type { RequestRow } from './view.ts';
import { describeRequirement } from './eligible.ts';
import type { Requirement } from './rules/index.ts';

/**
 * The queueing side of notifications (docs/notifications.md): which notices a state change queues, and
 * queueing them in the same statement as the change. Sending is the deliverer's (src/notify/), on its own
 * loop, so a tool call never waits for a mail server or a webhook.
 */

/** How much of the content a notice shows: its first part; the review page shows all of it. */
export const EXCERPT_CHARS = 500;

/** What a notice tells of one request: the facts people decide on, never a token or secret. */
export interface Notice {
  event: NotificationEvent;
  approval_request_id: string;
  agent_id: string;
  /** The requesting agent's name, added when the notice is queued. */
  agent?: string;
  /** The tool as stored on the request (built-ins unprefixed, as the webhook always sent it). */
  tool: string;
  target: { target_type: string; target_id: string; display_name: string | null };
  /** Where the write goes: the connector the dry run resolved to (null on requests from before it was kept). */
  source: string | null;
  content_sha256: string;
  file_sha256: string | null;
  /**
   * The content's first EXCERPT_CHARS characters (a message's text, else the reviewed fields as JSON),
   * with every invisible or reordering character as a marker naming it (src/core/visible.ts).
   */
  excerpt: string;
  excerpt_truncated: boolean;
  /** How many invisible or reordering characters the request holds (target, content); 0 when none. */
  hidden_count?: number;
  /** Other directory entries the target's name looks like, and the scripts it mixes (review.target_flags). */
  looks_like?: { target_id: string; display_name: string }[];
  mixed_scripts?: string[];
  /** The whole message text: only in webhook notices, and only with web.webhook_include_content. */
  content_text?: string;
  file: { name: string; size_bytes: number | null } | null;
  status: string;
  review_url: string | null;
  expires_at: string;
  approvers: string[];
  decided_by: string | null;
  note: string | null;
  /**
   * Who must approve and how far it is: the approval rule that matched ("Payments over EUR 10,000: 2 of
   * finance") and the approvals so far ("1 of 2"). Absent on notices queued before rules existed.
   */
  rule?: { name: string | null; asks: string; progress: string };
}

/** The request as a notice needs it. */
export type NoticeFacts = Pick<
  RequestRow,
  | 'id'
  | 'agent_id'
  | 'tool'
  | 'source'
  | 'target_type'
  | 'target_id'
  | 'target_display'
  | 'content_sha256'
  | 'file_sha256'
  | 'review'
  | 'status'
  | 'expires_at'
  | 'note'
> &
  Partial<Pick<RequestRow, 'policy_rule' | 'policy_requirement' | 'required_approvers'>>;

/** The rule line of a notice, from the request's binding and the approvals given so far. */
function ruleOf(row: NoticeFacts, approvers: string[]): Notice['rule'] {
  if (row.required_approvers === undefined) return undefined;
  const req = (row.policy_requirement as Requirement | null | undefined) ?? {
    kind: 'require' as const,
    approvers: row.required_approvers,
  };
  const words = describeRequirement(req);
  const from = req.kind === 'require' && req.roles ? ` from ${req.roles.join(' or ')}` : '';
  return {
    name: row.policy_rule ?? null,
    asks: row.policy_rule ? `${row.policy_rule}: ${words}` : words,
    progress: `${approvers.length} of ${row.required_approvers}${from}`,
  };
}

/** What of ApprovalDeps this needs (not the type itself: deps.ts queues through this module). */
interface NoticeDeps {
  config: Config;
  reviewUrl(id: string): string | null;
}

/** The channels notices go to, as configured: none means nothing is queued at all. */
export function channelsOf(config: Config): { webhook: string | null; email: boolean; slack: string | null } {
  const { webhook_url: url, webhook_secret: secret } = config.web;
  // The outbox row names the webhook by origin: a Slack-style webhook URL's path is itself the credential.
  return {
    webhook: url && secret ? new URL(url).origin : null,
    email: Boolean(config.notifications.email),
    slack: config.notifications.slack?.channel ?? null,
  };
}

/** What of a review is content: all of it but the flags about its target. */
const contentOf = (review: Record<string, unknown>) => {
  const { target_flags: _flags, ...content } = review;
  return content;
};

/**
 * The content's first EXCERPT_CHARS characters (code points, so no character is cut in half), with its
 * invisible characters as markers; a marker counts for its own length, since that is what is shown.
 */
function excerptOf(review: Record<string, unknown>): { excerpt: string; excerpt_truncated: boolean } {
  const text =
    typeof review.content_text === 'string' ? review.content_text : (canonicalize(contentOf(review)) ?? '');
  const chars = Array.from(marked(text));
  return { excerpt: chars.slice(0, EXCERPT_CHARS).join(''), excerpt_truncated: chars.length > EXCERPT_CHARS };
}

/** A notice's target as every channel names it: display name, type and id, invisible characters marked. */
export const targetLine = (n: Pick<Notice, 'target'>) =>
  marked(`${n.target.display_name ?? n.target.target_id} (${n.target.target_type} ${n.target.target_id})`);

/**
 * What a chair is warned of before the content, one sentence each: invisible or reordering characters
 * (shown as markers), a target that looks like another directory entry, a name that mixes scripts.
 */
export function noticeWarnings(n: Pick<Notice, 'hidden_count' | 'looks_like' | 'mixed_scripts'>): string[] {
  const hidden = n.hidden_count ?? 0;
  return [
    ...(hidden > 0
      ? [
          `${hidden} invisible or reordering character${hidden === 1 ? '' : 's'} in this request, each shown as a marker such as ⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧.`,
        ]
      : []),
    ...(n.looks_like ?? []).map((l) =>
      marked(`The target looks like ${l.display_name} (${l.target_id}) in the directory.`),
    ),
    ...(n.mixed_scripts?.length ? [`The target's name mixes scripts: ${n.mixed_scripts.join(', ')}.`] : []),
  ];
}

/**
 * Whether a notice shows everything a chair approves: the whole content, no file (whose bytes no
 * message shows), and nothing hidden. Only then may a channel offer an Approve button (Slack). Content
 * holding invisible or reordering characters is shown with markers, but decided on the review page,
 * which sets them apart from the text and counts them above it.
 */
export const showsEverything = (n: Pick<Notice, 'excerpt_truncated' | 'file' | 'hidden_count'>): boolean =>
  !n.excerpt_truncated && n.file === null && !n.hidden_count;

/** The same question asked of a stored request's review, for a click on an Approve button. */
export const reviewShowsEverything = (review: Record<string, unknown>): boolean =>
  typeof review.file_name !== 'string' &&
  !excerptOf(review).excerpt_truncated &&
  countHiddenIn(contentOf(review)) === 0;

/** The target's flags as a notice carries them (absent when there are none). */
function flagsOf(review: Record<string, unknown>) {
  const flags = review.target_flags as
    { looks_like?: { target_id: string; display_name: string }[]; scripts?: string[] } | undefined;
  return {
    ...(flags?.looks_like?.length ? { looks_like: flags.looks_like } : {}),
    ...(flags?.scripts?.length ? { mixed_scripts: flags.scripts } : {}),
  };
}

function noticeOf(
  deps: NoticeDeps,
  event: NotificationEvent,
  row: NoticeFacts,
  decision: { approvers: string[]; decided_by: string | null },
): Notice {
  const { review } = row;
  return {
    event,
    approval_request_id: row.id,
    agent_id: row.agent_id,
    tool: row.tool,
    target: { target_type: row.target_type, target_id: row.target_id, display_name: row.target_display },
    source: row.source,
    content_sha256: row.content_sha256,
    file_sha256: row.file_sha256,
    ...excerptOf(review),
    hidden_count: countHiddenIn([row.target_id, row.target_display, contentOf(review)]),
    ...flagsOf(review),
    file:
      typeof review.file_name === 'string'
        ? {
            name: review.file_name,
            size_bytes: typeof review.file_size_bytes === 'number' ? review.file_size_bytes : null,
          }
        : null,
    status: row.status,
    review_url: deps.reviewUrl(row.id),
    expires_at: row.expires_at,
    ...decision,
    note: row.note,
    ...(row.required_approvers === undefined ? {} : { rule: ruleOf(row, decision.approvers) }),
  };
}

/**
 * The deliveries one event of one request queues: one per configured channel (e-mail: per fixed
 * recipient, or one standing for every chair with an address; Slack: its channel). None when no
 * channel is configured or the event is not one notices are sent for.
 */
export function deliveriesFor(
  deps: NoticeDeps,
  event: NotificationEvent,
  row: NoticeFacts,
  decision: { approvers: string[]; decided_by: string | null } = { approvers: [], decided_by: null },
): Delivery[] {
  const { config } = deps;
  if (!config.notifications.events.includes(event)) return [];
  const channels = channelsOf(config);
  if (!channels.webhook && !channels.email && !channels.slack) return [];
  const notice = noticeOf(deps, event, row, decision);
  const out: Delivery[] = [];
  const base = { event, approval_request_id: row.id } as const;
  if (channels.webhook) {
    const text = config.web.webhook_include_content ? row.review.content_text : undefined;
    const payload = { ...notice, ...(typeof text === 'string' ? { content_text: text } : {}) };
    out.push({ ...base, channel: 'webhook', recipient: channels.webhook, payload });
  }
  const email = config.notifications.email;
  if (email) {
    const recipients = email.to.length > 0 ? email.to : [null];
    for (const recipient of recipients) out.push({ ...base, channel: 'email', recipient, payload: notice });
  }
  // One Slack message per request, in the configured channel; decisions and expiries update it.
  if (channels.slack) out.push({ ...base, channel: 'slack', recipient: channels.slack, payload: notice });
  return out;
}
