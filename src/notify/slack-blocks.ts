import { noticeWarnings, showsEverything, targetLine, type Notice } from '../approval/index.ts';
import { marked } from '../core/visible.ts';

/**
 * What the Slack message of a request shows (Block Kit), and how its buttons name the request. Text
 * that comes from a request (the content, a display name, a note) goes into `plain_text` objects, or is
 * escaped where it must stand in `mrkdwn`, so it is shown as written and can neither mention nor link.
 */

export type Block = Record<string, unknown>;

/** The block_id of the buttons: what a decision or an expiry takes away. */
export const ACTIONS_BLOCK = 'countersign_decision';
/** The callback_id of the modal that asks for a rejection's note, and its input. */
export const REJECT_VIEW = 'countersign_reject';
export const NOTE_BLOCK = 'note';

/** `&`, `<` and `>` are Slack's control characters in mrkdwn; escaped, text stays text. */
export const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
/** At most `n` characters (code points), with an ellipsis when cut: Slack refuses over-long fields. */
const cut = (s: string, n: number) => {
  const chars = Array.from(s);
  return chars.length > n ? `${chars.slice(0, n - 1).join('')}…` : s;
};
const plain = (text: string) => ({ type: 'plain_text', text: text === '' ? ' ' : text, emoji: false });

/** A button's value: the request and the content hash the message showed (checked when clicked). */
export const decisionValue = (id: string, sha256: string) => `${id}:${sha256}`;

export function parseDecisionValue(value: string | undefined): { id: string; sha256: string } | undefined {
  const m = /^([0-9a-f-]{36}):([0-9a-f]{64})$/i.exec(value ?? '');
  return m ? { id: m[1]!, sha256: m[2]! } : undefined;
}

/** Why a message offers no Approve button: what it cannot show, and where to see it. */
function whyNoApprove(n: Notice): string {
  const what = n.file
    ? "A file's bytes cannot be shown in Slack"
    : n.excerpt_truncated
      ? `The content is longer than Slack can show (it shows the first ${Array.from(n.excerpt).length} characters)`
      : 'The content holds invisible or reordering characters (shown here as markers)';
  const where = n.review_url
    ? 'read all of it on the review page and decide there'
    : `decide with the CLI after reading it: countersign approvals show ${n.approval_request_id}`;
  return `${what}, so this message offers no Approve: ${where}. Reject works here.`;
}

/** The notification line (what a phone shows): mrkdwn, escaped. */
export const fallbackText = (n: Notice) =>
  esc(cut(`Approval needed: ${n.tool} to ${targetLine(n)} from agent ${n.agent ?? n.agent_id}`, 300));

/** The message of a new request: what is to be written, where, by which agent, its hash and the buttons. */
export function requestBlocks(n: Notice): Block[] {
  const value = decisionValue(n.approval_request_id, n.content_sha256);
  // Approve only where the message shows everything that is approved (docs/notifications.md).
  const complete = showsEverything(n);
  const approve = {
    type: 'button',
    action_id: 'approve',
    style: 'primary',
    text: plain('Approve'),
    value,
    confirm: {
      title: plain('Approve this write?'),
      text: plain(`It is sent exactly as shown (SHA-256 ${n.content_sha256.slice(0, 16)}…).`),
      confirm: plain('Approve'),
      deny: plain('Cancel'),
    },
  };
  const reject = { type: 'button', action_id: 'reject', style: 'danger', text: plain('Reject'), value };
  const warnings = noticeWarnings(n).map((w) => `Warning: ${w}`);
  const content: Block[] = n.file
    ? [
        {
          type: 'section',
          text: plain(cut(marked(`File: ${n.file.name} (${String(n.file.size_bytes ?? '?')} bytes)`), 2900)),
        },
      ]
    : [
        {
          type: 'context',
          elements: [
            { type: 'mrkdwn', text: n.excerpt_truncated ? '*Content* (first part):' : '*Content*:' },
          ],
        },
        { type: 'section', text: plain(n.excerpt) },
      ];
  const links = [
    `Request \`${n.approval_request_id}\`, expires ${n.expires_at}`,
    ...(n.review_url ? [`<${encodeURI(n.review_url)}|Review the whole request>`] : []),
  ];
  return [
    { type: 'header', text: plain(cut(`Approval needed: ${n.tool}`, 150)) },
    {
      type: 'section',
      fields: [
        { type: 'mrkdwn', text: `*Target*\n${esc(cut(targetLine(n), 1900))}` },
        { type: 'mrkdwn', text: `*Agent*\n${esc(cut(n.agent ?? n.agent_id, 200))}` },
        { type: 'mrkdwn', text: `*Source*\n${esc(cut(n.source ?? '(not recorded)', 200))}` },
        ...(n.rule
          ? [
              {
                type: 'mrkdwn',
                text: `*Who approves*\n${esc(cut(`${n.rule.asks} (${n.rule.progress})`, 1900))}`,
              },
            ]
          : []),
      ],
    },
    ...(warnings.length > 0
      ? [{ type: 'section', block_id: 'countersign_warnings', text: plain(cut(warnings.join('\n'), 2900)) }]
      : []),
    ...content,
    {
      type: 'context',
      elements: [
        { type: 'mrkdwn', text: `Content SHA-256: \`${n.content_sha256}\`` },
        ...(n.file_sha256 ? [{ type: 'mrkdwn', text: `File SHA-256: \`${n.file_sha256}\`` }] : []),
      ],
    },
    { type: 'context', elements: [{ type: 'mrkdwn', text: links.join(' · ') }] },
    ...(complete
      ? []
      : [{ type: 'section', block_id: 'countersign_no_approve', text: plain(whyNoApprove(n)) }]),
    {
      type: 'actions',
      block_id: ACTIONS_BLOCK,
      elements: [...(complete ? [approve] : []), reject],
    },
  ];
}

/** How a request ended, as a message update says it. */
export interface Outcome {
  status: string;
  by: string | null;
  note: string | null;
}

export function outcomeText(o: Outcome): string {
  const by = o.by ? ` by ${o.by}` : '';
  switch (o.status) {
    case 'approved':
      return `Approved${by}.`;
    case 'rejected':
      return `Rejected${by}.`;
    case 'expired':
      return 'Expired: this request can no longer be approved or executed.';
    default:
      return `This request is ${o.status}${by}.`;
  }
}

/** The posted message with its buttons taken away and the outcome (and a rejection's note) added. */
export function withOutcome(posted: readonly Block[], o: Outcome): Block[] {
  const kept = posted.filter(
    (b) =>
      b.type !== 'actions' && b.block_id !== 'countersign_outcome' && b.block_id !== 'countersign_no_approve',
  );
  const elements = [plain(outcomeText(o)), ...(o.note ? [plain(cut(`Note: ${o.note}`, 2000))] : [])];
  return [...kept, { type: 'context', block_id: 'countersign_outcome', elements }];
}

/** The modal a Reject click opens: the note a rejection needs. */
export function rejectModal(privateMetadata: string): Block {
  return {
    type: 'modal',
    callback_id: REJECT_VIEW,
    private_metadata: privateMetadata,
    title: plain('Reject the request'),
    submit: plain('Reject'),
    close: plain('Cancel'),
    blocks: [
      {
        type: 'input',
        block_id: NOTE_BLOCK,
        label: plain('Why? The agent reads this note.'),
        element: { type: 'plain_text_input', action_id: NOTE_BLOCK, multiline: true, max_length: 2000 },
      },
    ],
  };
}
