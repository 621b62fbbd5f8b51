import nodemailer from 'nodemailer';
import { noticeWarnings, showsEverything, targetLine, type Notice } from '../approval/index.ts';
import { marked } from '../core/visible.ts';
import type { EmailConfig } from '../config.ts';

/** Header values come from requests (a contact's display name): no line breaks may reach a header. */
const oneLine = (s: string) => s.replace(/[\r\n\t]+/g, ' ').slice(0, 200);

/** Why this mail is not enough to decide on: what it leaves out. */
const notEverything = (n: Notice) =>
  n.file
    ? "This mail does not show the file's bytes: read the file on the review page before deciding."
    : n.excerpt_truncated
      ? 'This mail shows only the first part of the content: read all of it on the review page before deciding.'
      : 'The content holds invisible or reordering characters, shown here as markers: read it on the review page before deciding.';

export function subjectOf(n: Notice): string {
  const what = `${n.tool} to ${marked(n.target.display_name ?? n.target.target_id)}`;
  const agent = n.agent ?? n.agent_id;
  switch (n.event) {
    case 'requested':
      return oneLine(`[countersign] Approval needed: ${what} (agent ${agent})`);
    case 'decided':
      return oneLine(`[countersign] ${n.status === 'approved' ? 'Approved' : 'Rejected'}: ${what}`);
    case 'expired':
      return oneLine(`[countersign] Expired: ${what}`);
  }
}

/**
 * The mail's text: what is to be written, where, by which agent, the content's first part and its
 * SHA-256 (what an approval is bound to), and the review link. Plain text only: the content is shown as
 * it is, never interpreted as HTML. No token, approval_id or password is ever in it.
 */
export function bodyOf(n: Notice): string {
  const head = {
    requested: 'A write waits for a chair to decide.',
    decided: `This request was ${n.status}${n.decided_by ? ` by ${n.decided_by}` : ''}.`,
    expired: 'This request expired: it can no longer be approved or executed.',
  }[n.event];
  const content = n.file
    ? [marked(`File:    ${n.file.name} (${String(n.file.size_bytes)} bytes)`)]
    : [
        `Content${n.excerpt_truncated ? ' (first part)' : ''}:`,
        ...n.excerpt.split('\n').map((l) => `  ${l}`),
      ];
  const review = n.review_url
    ? `Review and decide: ${n.review_url}`
    : `Decide with the CLI (no web form is served): countersign approvals approve|reject ${n.approval_request_id} --as <chair>`;
  const requested = n.event === 'requested';
  return [
    head,
    ...(requested ? noticeWarnings(n).map((w) => `WARNING: ${w}`) : []),
    ...(requested && !showsEverything(n) ? [notEverything(n)] : []),
    '',
    `Tool:    ${n.tool}`,
    `Target:  ${targetLine(n)}`,
    `Source:  ${n.source ?? '(not recorded)'}`,
    `Agent:   ${n.agent ?? n.agent_id}`,
    ...(n.rule ? [`Rule:    ${n.rule.asks} (${n.rule.progress})`] : []),
    ...content,
    `Content SHA-256: ${n.content_sha256}`,
    ...(n.file_sha256 ? [`File SHA-256:    ${n.file_sha256}`] : []),
    ...(n.note ? [`Note:    ${marked(n.note)}`] : []),
    `Request: ${n.approval_request_id} (expires ${n.expires_at})`,
    '',
    review,
    '',
  ].join('\n');
}

export interface Mailer {
  send(to: string, notice: Notice): Promise<void>;
  close(): void;
}

/** Mail through the configured SMTP relay; each attempt bounded by `timeoutMs`. */
export function createMailer(config: EmailConfig, timeoutMs: number): Mailer {
  const timeouts = { connectionTimeout: timeoutMs, greetingTimeout: timeoutMs, socketTimeout: timeoutMs };
  const transport = config.smtp_url
    ? nodemailer.createTransport({ url: config.smtp_url, ...timeouts })
    : nodemailer.createTransport({
        host: config.host,
        port: config.port,
        secure: config.secure,
        ...(config.user ? { auth: { user: config.user, pass: config.password } } : {}),
        ...timeouts,
      });
  return {
    async send(to, notice) {
      await transport.sendMail({
        from: config.from,
        to,
        subject: subjectOf(notice),
        text: bodyOf(notice),
      });
    },
    close: () => transport.close(),
  };
}
