/**
 * The notices' front door: the only file of notify/ that modules outside it import
 * (.dependency-cruiser.cjs). The deliverer, and what the Slack pages need of the Slack channel.
 */
import type { AuditLog } from '../audit/index.ts';
import type { Leadership } from '../cluster/leadership.ts';
import type { Config } from '../config.ts';
import type { Connection } from '../db/knex.ts';
import type { Logger } from '../log.ts';
import { CLAIM_BATCH, deliverDue, type DeliveryDeps } from './deliver.ts';
import { createMailer } from './email.ts';
import { createSlackApi, createSlackChannel } from './slack.ts';
import { createSlackStore } from './slack-store.ts';
import { sendWebhook } from './webhook.ts';

export interface Notifications {
  /** Looks for due notices now (after a change queued some), if this replica delivers. */
  kick(): void;
  /** Delivers what is due until nothing is, now; for tests and the CLI. */
  deliverNow(): Promise<void>;
  close(): Promise<void>;
}

/** The configured channels, with the values that must never be recorded. */
function openChannels(config: Config, knex: Connection) {
  const channels: DeliveryDeps['channels'] = {};
  const secrets: string[] = [];
  const closers: (() => void)[] = [];
  const timeoutMs = config.notifications.send_timeout_ms;
  const { webhook_url: url, webhook_secret: secret } = config.web;
  if (url && secret) {
    channels.webhook = (_recipient, notice) => sendWebhook({ url, secret, timeoutMs }, notice);
    secrets.push(url, secret);
  }
  const email = config.notifications.email;
  if (email) {
    const mailer = createMailer(email, timeoutMs);
    channels.email = (to, notice) => mailer.send(to, notice);
    closers.push(() => mailer.close());
    if (email.password) secrets.push(email.password);
    if (email.smtp_url) secrets.push(email.smtp_url, decodeURIComponent(new URL(email.smtp_url).password));
  }
  const slack = config.notifications.slack;
  if (slack) {
    channels.slack = createSlackChannel({
      knex,
      store: createSlackStore(knex),
      api: createSlackApi(slack, timeoutMs),
    });
    secrets.push(slack.bot_token, slack.signing_secret);
  }
  return { channels, secrets, close: () => closers.forEach((c) => c()) };
}

/**
 * The deliverer: on the replica that leads the cluster (always, on PGlite), it claims due notices,
 * sends them and records each attempt — at every poll, at once when this process queued some, and when
 * it takes the lead. Nothing starts when no channel is configured. A tool call never waits for it: a
 * call only queues rows, in the statement of its own change.
 */
export function startNotifications(
  base: { knex: Connection; audit: AuditLog; config: Config; log: Logger },
  leadership: Leadership,
): Notifications | undefined {
  const opened = openChannels(base.config, base.knex);
  if (Object.keys(opened.channels).length === 0) return undefined;
  const deps: DeliveryDeps = { ...base, channels: opened.channels, secrets: opened.secrets };
  let closed = false;
  let running: Promise<void> | undefined;
  let again = false;

  const drain = async () => {
    try {
      while (!closed && (await deliverDue(deps)) === CLAIM_BATCH);
    } catch (err) {
      base.log.error({ err }, 'notification delivery failed; will try again');
    }
  };
  const kick = () => {
    if (closed || !leadership.isLeader()) return;
    if (running) {
      again = true; // a change committed during this pass: look once more after it
      return;
    }
    running = drain().finally(() => {
      running = undefined;
      if (again) {
        again = false;
        kick();
      }
    });
  };
  const timer = setInterval(kick, base.config.notifications.poll_interval_ms);
  timer.unref();
  leadership.onLead(kick);
  return {
    kick,
    async deliverNow() {
      while (running) await running;
      await drain();
    },
    async close() {
      closed = true;
      clearInterval(timer);
      while (running) await running;
      opened.close();
    },
  };
}

export { NOTE_BLOCK, parseDecisionValue, REJECT_VIEW, rejectModal } from './slack-blocks.ts';
export { createSlackApi, updateWithOutcome, type SlackApi } from './slack.ts';
export { createSlackStore, type SlackStore } from './slack-store.ts';
