import { z } from 'zod';
import { cursorParam, limitParam, queryText, sourceField, sourcePreferenceParam } from '../params.ts';
import type { ReadToolDef } from '../types.ts';

const input = z.strictObject({
  query: queryText.describe('Name, account, department or title to look for (any script).'),
  limit: limitParam(20, 100),
  cursor: cursorParam,
  source_preference: sourcePreferenceParam,
  include_inactive: z.boolean().default(false).describe('Also return deactivated contacts.'),
});

const Contact = z.object({
  contact_id: z.string(),
  display_name: z.string(),
  account: z.string().nullable(),
  department: z.string().nullable(),
  title: z.string().nullable(),
  active: z.boolean(),
  source: sourceField,
  confidence: z.number(),
  raw_ref: z.string(),
});

const output = z.object({ contacts: z.array(Contact) });

export const searchContacts = {
  name: 'search_contacts',
  title: 'Search contacts',
  description:
    'Find people in the directory by name, account, department or title, to resolve a contact before ' +
    'reading or drafting. Best matches first (exact name, name prefix, anywhere). Read-only.',
  facet: 'directory',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const connector = ctx.connectors.pick(args.source_preference);
    const query = { query: args.query, include_inactive: args.include_inactive, source: connector.source };
    const page = await ctx.cursors.page('search_contacts', query, args.cursor, (after) =>
      connector.searchContacts({
        query: args.query,
        includeInactive: args.include_inactive,
        limit: args.limit,
        after,
      }),
    );
    return {
      data: { contacts: page.items.map((c) => ({ ...c, source: connector.source })) },
      empty: page.items.length === 0,
      next_cursor: page.next_cursor,
      audit: { source: connector.source, details: { count: page.items.length } },
    };
  },
} satisfies ReadToolDef<typeof input, typeof output>;
