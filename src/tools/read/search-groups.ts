import { z } from 'zod';
import { cursorParam, limitParam, queryText, sourceField, sourcePreferenceParam } from '../params.ts';
import type { ReadToolDef } from '../types.ts';

const input = z.strictObject({
  query: queryText
    .optional()
    .describe('Group name to look for (any script); leave it out to list every group, by name.'),
  limit: limitParam(20, 100),
  cursor: cursorParam,
  source_preference: sourcePreferenceParam,
  include_archived: z.boolean().default(false).describe('Also return archived groups.'),
});

const Group = z.object({
  group_id: z.string(),
  display_name: z.string(),
  member_count: z.number().int().nullable(),
  owner_ref: z.string().nullable(),
  archived: z.boolean(),
  source: sourceField,
  confidence: z.number(),
  raw_ref: z.string(),
});

const output = z.object({ groups: z.array(Group) });

export const searchGroups = {
  name: 'search_groups',
  title: 'Search groups',
  description:
    'Find group conversations by name, to resolve a group before reading or drafting. Best matches first; ' +
    'without a query, every group by name. Read-only.',
  facet: 'directory',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const connector = ctx.connectors.pick(args.source_preference);
    // No query: every group (the empty key matches every name, ranked alike, so ordered by name).
    const text = args.query ?? '';
    const query = { query: text, include_archived: args.include_archived, source: connector.source };
    const page = await ctx.cursors.page('search_groups', query, args.cursor, (after) =>
      connector.searchGroups({
        query: text,
        includeArchived: args.include_archived,
        limit: args.limit,
        after,
      }),
    );
    return {
      data: { groups: page.items.map((g) => ({ ...g, source: connector.source })) },
      empty: page.items.length === 0,
      next_cursor: page.next_cursor,
      audit: { source: connector.source, details: { count: page.items.length } },
    };
  },
} satisfies ReadToolDef<typeof input, typeof output>;
