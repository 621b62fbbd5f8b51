import { createHmac } from 'node:crypto';
import type { Notice } from '../approval/index.ts';
import { marked } from '../core/visible.ts';
import { esc } from './slack-blocks.ts';

/** Where the webhook goes and how it is signed (config web.webhook_url and web.webhook_secret). */
export interface WebhookTarget {
  url: string;
  secret: string;
  timeoutMs: number;
}

const targetOf = (n: Notice) => esc(marked(n.target.display_name ?? n.target.target_id));

/**
 * The notice's line for people; a Slack incoming webhook shows only this. Every value in it is escaped
 * as Slack's mrkdwn needs (`&`, `<`, `>`), as the Slack blocks are: a request's content or names can
 * neither mention (`<!channel>`) nor disguise a link (`<https://…|text>`).
 */
function textOf(n: Notice): string {
  const what = `${esc(n.tool)} to ${targetOf(n)} (${esc(n.target.target_type)} ${esc(marked(n.target.target_id))})`;
  const review = n.review_url
    ? `Review: ${esc(n.review_url)}`
    : `Decide with the CLI (no web form is served): countersign approvals approve|reject ${n.approval_request_id} --as &lt;chair&gt;`;
  switch (n.event) {
    case 'requested': {
      const lines = [`New approval request: ${what} from agent ${esc(n.agent ?? n.agent_id)}.`, review];
      if (n.content_text !== undefined) lines.push(`> ${esc(marked(n.content_text))}`);
      if (n.file) lines.push(`File: ${esc(n.file.name)} (${String(n.file.size_bytes)} bytes)`);
      return lines.join('\n');
    }
    case 'decided':
      return [
        `Approval request ${n.approval_request_id} (${what}) was ${n.status} by ${esc(n.decided_by ?? 'a chair')}.`,
        ...(n.note ? [`Note: ${esc(marked(n.note))}`] : []),
      ].join('\n');
    case 'expired':
      return `Approval request ${n.approval_request_id} (${what}) expired without being used.`;
  }
}

/**
 * The webhook's body: Slack-compatible JSON (`text`) with the request's facts. The message body is in
 * it only when web.webhook_include_content put it in the notice.
 */
export function webhookBody(n: Notice): string {
  return JSON.stringify({
    text: textOf(n),
    event: n.event,
    approval_request_id: n.approval_request_id,
    review_url: n.review_url,
    tool: n.tool,
    agent: n.agent ?? null,
    target: n.target,
    source: n.source,
    status: n.status,
    content_sha256: n.content_sha256,
    expires_at: n.expires_at,
  });
}

/**
 * POSTs the notice, signed with HMAC-SHA256 over `timestamp + "." + body` in
 * `X-Countersign-Signature: sha256=…` (and the timestamp in `X-Countersign-Timestamp`), so the receiver
 * can tell it came from this server and is fresh. Anything but a 2xx answer is a failed attempt: a
 * redirect is not followed (the signed notice goes to the configured URL only) and is retried as any
 * failure is.
 */
export async function sendWebhook(target: WebhookTarget, notice: Notice): Promise<void> {
  const body = webhookBody(notice);
  const timestamp = String(Math.floor(Date.now() / 1000));
  const signature = createHmac('sha256', target.secret).update(`${timestamp}.${body}`).digest('hex');
  const res = await fetch(target.url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-countersign-timestamp': timestamp,
      'x-countersign-signature': `sha256=${signature}`,
    },
    body,
    redirect: 'manual',
    signal: AbortSignal.timeout(target.timeoutMs),
  });
  // The answer's body is not read into the audit log: it is the receiver's, and may say anything.
  await res.body?.cancel();
  if (res.status >= 300 && res.status < 400) {
    throw new Error(`the webhook answered a redirect (HTTP ${res.status}), which is not followed`);
  }
  if (!res.ok) throw new Error(`the webhook answered HTTP ${res.status}`);
}
