import { z } from 'zod';
import { AppError } from '../../core/errors.ts';
import type { MemoryToolDef } from '../types.ts';

/** A value's size limit in UTF-8 bytes. */
export const MAX_VALUE_BYTES = 64 * 1024;
const DAY_S = 24 * 3600;

export const SessionId = z.string().min(1).max(128).describe('The session the note belongs to.');
export const MemoryKey = z.string().min(1).max(128).describe("The note's key within the session.");

const input = z.strictObject({
  session_id: SessionId,
  key: MemoryKey.describe("The note's key within the session; storing under it again replaces the note."),
  value: z.string().describe(`The note, at most ${MAX_VALUE_BYTES / 1024} KiB of UTF-8.`),
  ttl_seconds: z
    .number()
    .int()
    .min(60)
    .max(30 * DAY_S)
    .default(DAY_S)
    .describe('How long the note lives: 60 s to 30 days (2,592,000 s); default 1 day.'),
});
const output = z.object({ session_id: z.string(), key: z.string(), expires_at: z.string() });

/** Internal state of the agent's own: no approval, sent nowhere (kind internal). */
export const remember = {
  name: 'remember',
  title: 'Remember',
  description:
    'Store a note for this agent under a session and key (replacing any earlier one) for ttl_seconds. Never sent anywhere.',
  facet: 'memory',
  kind: 'internal',
  input,
  output,
  async handler(args, ctx) {
    const bytes = Buffer.byteLength(args.value);
    if (bytes > MAX_VALUE_BYTES) {
      throw new AppError(
        'INVALID_ARGUMENT',
        `value is ${bytes} bytes; the limit is ${MAX_VALUE_BYTES}`,
        'value_too_large',
      );
    }
    const { expires_at } = await ctx.memory.remember(
      ctx.agent.id,
      args.session_id,
      args.key,
      args.value,
      args.ttl_seconds,
    );
    return {
      data: { session_id: args.session_id, key: args.key, expires_at },
      audit: { source: 'local', details: { ttl_seconds: args.ttl_seconds, bytes } },
    };
  },
} satisfies MemoryToolDef<typeof input, typeof output>;
