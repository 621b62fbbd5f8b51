import { createHash } from 'node:crypto';
import type { Knex } from 'knex';
import { z } from 'zod';

/** How long a seen signature is kept: past the skew on either side, a replay is refused as stale anyway. */
const SEEN_KEEP_MS = 10 * 60 * 1000;

const Posted = z.object({ channel: z.string().min(1), ts: z.string().min(1) });
const StoredMessage = Posted.extend({
  blocks: z
    .unknown()
    .transform((v) => (typeof v === 'string' ? (JSON.parse(v) as unknown) : v))
    .pipe(z.array(z.record(z.string(), z.unknown()))),
});

/** Where Slack put a message: its channel and timestamp (chat.postMessage's answer). */
export type Posted = z.infer<typeof Posted>;
export type StoredMessage = z.infer<typeof StoredMessage>;

/** Reads where chat.postMessage put a message from its answer; throws when the answer does not say. */
export const postedOf = (answer: unknown): Posted => Posted.parse(answer);

/**
 * What countersign keeps of its Slack app: the message posted for each request (slack_messages), to
 * update it with the outcome, and the signed callbacks seen (slack_callbacks_seen), so that none is
 * acted on twice.
 */
export interface SlackStore {
  /** The message posted for a request, with its blocks; undefined when none was. */
  postedFor(requestId: string): Promise<StoredMessage | undefined>;
  /** Records (or replaces) the message posted for a request. */
  savePosted(requestId: string, posted: Posted, blocks: unknown[]): Promise<void>;
  /**
   * Records a signed callback as seen; false when it was seen before (a replay), on any replica: the
   * database's primary key settles it. Rows past SEEN_KEEP_MS are purged on the way.
   */
  firstSighting(timestamp: string, signature: string): Promise<boolean>;
}

export function createSlackStore(knex: Knex): SlackStore {
  return {
    async postedFor(requestId) {
      const raw = (await knex('slack_messages').where({ approval_request_id: requestId }).first()) as unknown;
      return raw ? StoredMessage.parse(raw) : undefined;
    },
    async savePosted(requestId, posted, blocks) {
      await knex('slack_messages')
        .insert({ approval_request_id: requestId, ...posted, blocks: JSON.stringify(blocks) })
        .onConflict('approval_request_id')
        .merge();
    },
    async firstSighting(timestamp, signature) {
      const now = Date.now();
      await knex('slack_callbacks_seen')
        .where('seen_at', '<', new Date(now - SEEN_KEEP_MS).toISOString())
        .delete();
      const key = createHash('sha256').update(`${timestamp}:${signature}`).digest('hex');
      const inserted = (await knex('slack_callbacks_seen')
        .insert({ signature_sha256: key, seen_at: new Date(now).toISOString() })
        .onConflict('signature_sha256')
        .ignore()
        .returning('signature_sha256')) as unknown[];
      return inserted.length === 1;
    },
  };
}
