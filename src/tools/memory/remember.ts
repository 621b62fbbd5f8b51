import { z } from 'zod';
import { AppError } from '../../core/errors.ts';
import type { MemoryToolDef } from '../types.ts';

const MAX_VALUE_BYTES = 64 * 1024;

const input = z.strictObject({
  key: z.string().min(1).max(128),
  value: z
    .unknown()
    .refine((v) => v !== undefined, 'value is required')
    .describe('Any JSON value, at most 64 KiB.'),
  ttl_s: z
    .number()
    .int()
    .min(60)
    .max(30 * 24 * 3600)
    .default(24 * 3600)
    .describe('60 s to 30 days; default 1 day.'),
});
const output = z.object({ key: z.string(), expires_at: z.string() });

/** Internal state of the agent's own: no approval, not sent anywhere (kind internal). */
export const remember = {
  name: 'remember',
  title: 'Remember',
  description:
    'Store a note for this agent under a key (replacing any earlier one) for ttl_s seconds. Never sent anywhere.',
  facet: 'memory',
  kind: 'internal',
  input,
  output,
  async handler(args, ctx) {
    const bytes = Buffer.byteLength(JSON.stringify(args.value));
    if (bytes > MAX_VALUE_BYTES) {
      throw new AppError(
        'INVALID_ARGUMENT',
        `value is ${bytes} bytes; the limit is ${MAX_VALUE_BYTES}`,
        'value_too_large',
      );
    }
    const { expires_at } = await ctx.memory.remember(ctx.agent.id, args.key, args.value, args.ttl_s);
    return {
      data: { key: args.key, expires_at },
      audit: { source: 'local', details: { ttl_s: args.ttl_s, bytes } },
    };
  },
} satisfies MemoryToolDef<typeof input, typeof output>;
