import { z } from 'zod';
import { claimDueNotices, settleNotice, type Notice } from '../approval/index.ts';
import type { AuditLog } from '../audit/index.ts';
import type { Config } from '../config.ts';
import type { Connection } from '../db/knex.ts';
import type { Logger } from '../log.ts';

/** How many due notices one claim takes. */
export const CLAIM_BATCH = 20;

const Timestamp = z.union([z.date(), z.string()]).transform((v) => new Date(v).toISOString());

/** A claimed row of notification_outbox, parsed at the database boundary. */
const OutboxRow = z.object({
  id: z.string(),
  event: z.enum(['requested', 'decided', 'expired']),
  approval_request_id: z.string(),
  channel: z.enum(['webhook', 'email', 'slack']),
  recipient: z.string(),
  payload: z
    .unknown()
    .transform((v) => (typeof v === 'string' ? (JSON.parse(v) as unknown) : v))
    .pipe(z.record(z.string(), z.unknown())),
  attempts: z.coerce.number().int(),
  created_at: Timestamp,
  /** The requesting agent's name, read with the claim: the name the attempt's audit row records. */
  agent_name: z.string().nullable(),
});
export type OutboxRow = z.output<typeof OutboxRow>;

/** Sends one notice to one recipient over one channel; throws when the attempt failed. */
export type Send = (recipient: string, notice: Notice) => Promise<void>;

export interface DeliveryDeps {
  knex: Connection;
  audit: AuditLog;
  config: Config;
  log: Logger;
  /** The configured channels; a row of a channel not configured (any more) fails its attempts. */
  channels: Partial<Record<OutboxRow['channel'], Send>>;
  /**
   * Values that must never reach an audit row or a log line (webhook URL and secret, SMTP password,
   * Slack bot token and signing secret).
   */
  secrets: readonly string[];
}

/**
 * Claims due pending notices for this process, in one autocommit statement: `for update skip locked`
 * lets replicas claim side by side without ever taking the same row, and the claim pushes the row's
 * next attempt past a lease, so a replica that dies mid-send leaves it to be tried again after that.
 */
async function claim(deps: DeliveryDeps): Promise<OutboxRow[]> {
  const now = Date.now();
  const lease = new Date(now + 2 * deps.config.notifications.send_timeout_ms + 5_000);
  const rows = await claimDueNotices(deps.knex, { now: new Date(now), lease, limit: CLAIM_BATCH });
  return rows.map((r) => OutboxRow.parse(r));
}

/** An error as one short line, with every configured secret taken out. */
function describe(err: unknown, secrets: readonly string[]): string {
  const e = err as { message?: unknown; cause?: { message?: unknown } };
  let text = typeof e?.message === 'string' ? e.message : String(err);
  if (typeof e?.cause?.message === 'string') text += `: ${e.cause.message}`;
  for (const s of secrets) if (s) text = text.split(s).join('[redacted]');
  return text.replace(/\s+/g, ' ').slice(0, 300);
}

/** A failed attempt may carry how long the receiver asked to be left alone (Slack's Retry-After). */
type Attempt = { ok: true } | { ok: false; error: string; retryAfterMs?: number };

async function attempt(deps: DeliveryDeps, row: OutboxRow): Promise<Attempt> {
  const send = deps.channels[row.channel];
  if (!send) return { ok: false, error: `the ${row.channel} channel is not configured` };
  try {
    await send(row.recipient, row.payload as unknown as Notice);
    return { ok: true };
  } catch (err) {
    const retryAfterMs = (err as { retryAfterMs?: unknown }).retryAfterMs;
    return {
      ok: false,
      error: describe(err, deps.secrets),
      ...(typeof retryAfterMs === 'number' ? { retryAfterMs } : {}),
    };
  }
}

/**
 * When a failed attempt is tried again: doubling delays, or later when the receiver asked so, none past
 * the retry horizon (then failed).
 */
function nextAttempt(config: Config, row: OutboxRow, now: number, retryAfterMs = 0): string | null {
  const { backoff_initial_ms: first, backoff_max_ms: max, retry_horizon_s } = config.notifications;
  const delay = Math.max(retryAfterMs, Math.min(max, first * 2 ** Math.min(30, row.attempts - 1)));
  const giveUpAt = new Date(row.created_at).getTime() + retry_horizon_s * 1000;
  return now + delay > giveUpAt ? null : new Date(now + delay).toISOString();
}

/**
 * The attempt's outcome and its audit row (notification.delivered or notification.failed), committed
 * together. The row changes only while it is still this claim's (same attempt count): a claim whose lease
 * ran out and was taken over elsewhere records its attempt but leaves the row to the newer claim.
 */
async function record(deps: DeliveryDeps, row: OutboxRow, outcome: Attempt): Promise<void> {
  const now = Date.now();
  const retryAt = outcome.ok ? null : nextAttempt(deps.config, row, now, outcome.retryAfterMs);
  const state = outcome.ok ? 'delivered' : retryAt ? 'pending' : 'failed';
  const notice = row.payload as unknown as Partial<Notice>;
  await deps.knex.transaction(async (trx) => {
    await settleNotice(trx, row, {
      state,
      last_error: outcome.ok ? null : outcome.error,
      ...(outcome.ok ? { delivered_at: new Date(now).toISOString() } : {}),
      ...(retryAt ? { next_attempt_at: retryAt } : {}),
    });
    await deps.audit.appendIn(trx, {
      kind: outcome.ok ? 'notification.delivered' : 'notification.failed',
      agent_id: notice.agent_id ?? null,
      tool: notice.tool ?? null,
      target_type: notice.target?.target_type ?? null,
      target_ref: notice.target?.target_id ?? null,
      approval_request_id: row.approval_request_id,
      content_sha256: notice.content_sha256 ?? null,
      result: outcome.ok ? 'ok' : 'error',
      error_code: outcome.ok ? null : 'NOTIFICATION_FAILED',
      details: {
        event: row.event,
        channel: row.channel,
        recipient: row.recipient,
        attempt: row.attempts,
        ...(outcome.ok ? {} : { error: outcome.error, final: state === 'failed', next_attempt_at: retryAt }),
        ...(notice.agent_id && row.agent_name !== null ? { agent_name: row.agent_name } : {}),
      },
    });
  });
}

/** Claims one batch of due notices, sends each (outside any transaction) and records every outcome. */
export async function deliverDue(deps: DeliveryDeps): Promise<number> {
  const rows = await claim(deps);
  await Promise.all(
    rows.map(async (row) => {
      const outcome = await attempt(deps, row);
      try {
        await record(deps, row, outcome);
      } catch (err) {
        // The row stays claimed until its lease ends and is then tried again: sent twice at worst.
        deps.log.error({ err, notification_id: row.id }, 'a notification outcome could not be recorded');
      }
    }),
  );
  return rows.length;
}
