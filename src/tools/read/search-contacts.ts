import { z } from 'zod';
import { cursorParam, limitParam, queryText, sourcePreferenceParam } from '../params.ts';
import { directoryEntryFields, directoryPage } from './directory.ts';
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
  ...directoryEntryFields,
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
  handler: (args, ctx) =>
    directoryPage(ctx, {
      tool: 'search_contacts',
      key: 'contacts',
      preference: args.source_preference,
      query: { query: args.query, include_inactive: args.include_inactive },
      cursor: args.cursor,
      fetch: (connector, after) =>
        connector.searchContacts({
          query: args.query,
          includeInactive: args.include_inactive,
          limit: args.limit,
          after,
        }),
    }),
} satisfies ReadToolDef<typeof input, typeof output>;
