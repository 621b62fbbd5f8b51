import { createHmac } from 'node:crypto';
import type { ApprovalView } from './view.ts';
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';

/**
 * Tells people a request waits: a Slack-compatible JSON POST (`text`), signed with HMAC-SHA256 over
 * `timestamp + "." + body` in `X-Countersign-Signature: sha256=…`. The message body is left out unless
 * configured. Never blocks or fails the request that caused it: failures are logged.
 */
export function createNotifier(config: Config, log: Logger) {
  const { webhook_url: url, webhook_secret: secret, webhook_include_content: withContent } = config.web;
  if (!url || !secret) return undefined;
  return (view: ApprovalView, review: Record<string, unknown>, agentName: string): void => {
    const target = view.target.display_name ?? view.target.target_id;
    const lines = [
      `New approval request: ${view.tool} to ${target} (${view.target.target_type} ${view.target.target_id}) from agent ${agentName}.`,
      `Review: ${view.review_url}`,
    ];
    if (withContent && typeof review.content_text === 'string') lines.push(`> ${review.content_text}`);
    if (typeof review.file_name === 'string')
      lines.push(`File: ${review.file_name} (${String(review.file_size_bytes)} bytes)`);
    const body = JSON.stringify({
      text: lines.join('\n'),
      approval_request_id: view.approval_request_id,
      review_url: view.review_url,
      tool: view.tool,
      agent: agentName,
      target: view.target,
      expires_at: view.expires_at,
    });
    const timestamp = String(Math.floor(Date.now() / 1000));
    const signature = createHmac('sha256', secret).update(`${timestamp}.${body}`).digest('hex');
    fetch(url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-countersign-timestamp': timestamp,
        'x-countersign-signature': `sha256=${signature}`,
      },
      body,
      signal: AbortSignal.timeout(5000),
    })
      .then((res) => {
        if (!res.ok)
          log.warn(
            { status: res.status, approval_request_id: view.approval_request_id },
            'webhook refused the notice',
          );
      })
      .catch((err: unknown) =>
        log.warn({ err, approval_request_id: view.approval_request_id }, 'webhook notice failed'),
      );
  };
}
