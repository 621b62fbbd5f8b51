import { z } from 'zod';
import type { MemoryToolDef } from '../types.ts';
import { MemoryKey, SessionId } from './remember.ts';

const input = z.strictObject({ session_id: SessionId, key: MemoryKey });
const output = z.object({
  session_id: z.string(),
  key: z.string(),
  found: z.boolean(),
  value: z.string().nullable().describe('The stored note, or null when absent or expired.'),
  expires_at: z.string().nullable(),
});

export const recall = {
  name: 'recall',
  title: 'Recall',
  description:
    'Read back a note this agent stored with remember in the same session. Absent or expired: found=false, value=null.',
  facet: 'memory',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const note = await ctx.memory.recall(ctx.agent.id, args.session_id, args.key);
    return {
      data: {
        session_id: args.session_id,
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
