import { z } from 'zod';
import { cursorParam, limitParam, queryText, sourcePreferenceParam } from '../params.ts';
import { directoryEntryFields, directoryPage } from './directory.ts';
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
  ...directoryEntryFields,
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
  handler(args, ctx) {
    // No query: every group (the empty key matches every name, ranked alike, so ordered by name).
    const text = args.query ?? '';
    return directoryPage(ctx, {
      tool: 'search_groups',
      key: 'groups',
      preference: args.source_preference,
      query: { query: text, include_archived: args.include_archived },
      cursor: args.cursor,
      fetch: (connector, after) =>
        connector.searchGroups({
          query: text,
          includeArchived: args.include_archived,
          limit: args.limit,
          after,
        }),
    });
  },
} satisfies ReadToolDef<typeof input, typeof output>;
