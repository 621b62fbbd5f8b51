import { z } from 'zod';
import type { MemoryToolDef } from '../types.ts';

const input = z.strictObject({ key: z.string().min(1).max(128) });
const output = z.object({
  key: z.string(),
  found: z.boolean(),
  value: z.unknown().describe('The remembered JSON value, or null when absent or expired.'),
  expires_at: z.string().nullable(),
});

export const recall = {
  name: 'recall',
  title: 'Recall',
  description:
    'Read back a note this agent stored with remember. Absent or expired: found=false, value=null.',
  facet: 'memory',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const note = await ctx.memory.recall(ctx.agent.id, args.key);
    return {
      data: {
        key: args.key,
        found: Boolean(note),
        value: note?.value ?? null,
        expires_at: note?.expires_at ?? null,
      },
      empty: !note,
      audit: { source: 'local', details: { found: Boolean(note) } },
    };
  },
} satisfies MemoryToolDef<typeof input, typeof output>;
