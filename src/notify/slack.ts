import { z } from 'zod';
import { requestedNoticeWaiting, type Notice } from '../approval/index.ts';
import type { SlackConfig } from '../config.ts';
import type { Queryable } from '../db/knex.ts';
import type { Send } from './deliver.ts';
import {
  fallbackText,
  outcomeText,
  requestBlocks,
  withOutcome,
  type Block,
  type Outcome,
} from './slack-blocks.ts';
import { postedOf, type SlackStore } from './slack-store.ts';

/** The Web API methods countersign calls. users.info is a read method: Slack takes it form-encoded only. */
export type SlackMethod =
  'chat.postMessage' | 'chat.update' | 'chat.postEphemeral' | 'views.open' | 'users.info';

/**
 * A call Slack did not carry out: `ok: false` (Slack's `error` says why), an HTTP error, or a 429 with the
 * Retry-After it asked for, which the outbox honours before its next attempt.
 */
export class SlackApiError extends Error {
  override name = 'SlackApiError';
  constructor(
    message: string,
    readonly retryAfterMs?: number,
  ) {
    super(message);
  }
}

export interface SlackApi {
  /** Calls `method`; resolves Slack's answer when it is `ok`, throws SlackApiError otherwise. */
  call(
    method: SlackMethod,
    args: Record<string, unknown>,
    timeoutMs?: number,
  ): Promise<Record<string, unknown>>;
  /** Posts to a callback's response_url (an ephemeral answer to the user who clicked). */
  respond(responseUrl: string, body: Record<string, unknown>, timeoutMs?: number): Promise<void>;
}

const SlackAnswer = z.looseObject({ ok: z.boolean(), error: z.string().optional() });

/** Slack's Web API with the bot token, each call bounded by `timeoutMs` unless the call sets its own. */
export function createSlackApi(
  config: Pick<SlackConfig, 'bot_token' | 'api_base_url'>,
  timeoutMs: number,
): SlackApi {
  const base = config.api_base_url.replace(/\/+$/, '');
  return {
    async call(method, args, ms = timeoutMs) {
      const form = method === 'users.info';
      const res = await fetch(`${base}/${method}`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${config.bot_token}`,
          'content-type': form ? 'application/x-www-form-urlencoded' : 'application/json; charset=utf-8',
        },
        body: form
          ? new URLSearchParams(
              Object.entries(args).map(([k, v]): [string, string] => [k, String(v)]),
            ).toString()
          : JSON.stringify(args),
        signal: AbortSignal.timeout(ms),
      });
      if (res.status === 429) {
        await res.body?.cancel();
        const seconds = Number(res.headers.get('retry-after'));
        const wait = Number.isFinite(seconds) && seconds > 0 ? seconds : 30;
        throw new SlackApiError(`Slack ${method} was rate limited (retry after ${wait} s)`, wait * 1000);
      }
      if (!res.ok) {
        await res.body?.cancel();
        throw new SlackApiError(`Slack ${method} answered HTTP ${res.status}`);
      }
      const answer = SlackAnswer.safeParse(await res.json().catch(() => undefined));
      if (!answer.success) throw new SlackApiError(`Slack ${method} answered something that is not its JSON`);
      if (!answer.data.ok)
        throw new SlackApiError(`Slack ${method} failed: ${answer.data.error ?? 'no error given'}`);
      return answer.data;
    },
    async respond(responseUrl, body, ms = timeoutMs) {
      const res = await fetch(responseUrl, {
        method: 'POST',
        headers: { 'content-type': 'application/json; charset=utf-8' },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(ms),
      });
      await res.body?.cancel();
      if (!res.ok) throw new SlackApiError(`Slack's response_url answered HTTP ${res.status}`);
    },
  };
}

export interface SlackDeps {
  /** The messages posted, per request (notify's slack_messages). */
  store: Pick<SlackStore, 'postedFor' | 'savePosted'>;
  api: SlackApi;
}

/**
 * Updates the request's Slack message with how it ended, without its buttons. False when no message was
 * posted for it (none recorded).
 */
export async function updateWithOutcome(deps: SlackDeps, id: string, outcome: Outcome): Promise<boolean> {
  const message = await deps.store.postedFor(id);
  if (!message) return false;
  await deps.api.call('chat.update', {
    channel: message.channel,
    ts: message.ts,
    text: outcomeText(outcome),
    blocks: withOutcome(message.blocks as Block[], outcome),
  });
  return true;
}

/**
 * The Slack channel of the outbox. A new request is posted with its buttons, and where it went is
 * recorded; a decision or an expiry updates that message. When the request's message is still waiting
 * in the outbox, the update fails and is tried again after it; when it was never posted, there is
 * nothing to update.
 */
export function createSlackChannel(deps: SlackDeps & { knex: Queryable }): Send {
  return async (channel: string, notice: Notice) => {
    const id = notice.approval_request_id;
    if (notice.event === 'requested') {
      const blocks = requestBlocks(notice);
      const answer = await deps.api.call('chat.postMessage', {
        channel,
        text: fallbackText(notice),
        blocks,
        unfurl_links: false,
        unfurl_media: false,
      });
      await deps.store.savePosted(id, postedOf(answer), blocks);
      return;
    }
    const outcome = { status: notice.status, by: notice.decided_by, note: notice.note };
    if (await updateWithOutcome(deps, id, outcome)) return;
    if (await requestedNoticeWaiting(deps.knex, id, 'slack'))
      throw new Error("the request's Slack message is not posted yet");
  };
}
