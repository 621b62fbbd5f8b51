import { z } from 'zod';
import type { Connector, SourcePreference } from '../../connectors/index.ts';
import { sourceField } from '../params.ts';
import type { ReadContext, ToolOutcome } from '../types.ts';

/** The fields every directory entry (a contact, a group) ends with: who answered, and how well it matched. */
export const directoryEntryFields = {
  source: sourceField,
  confidence: z.number(),
  raw_ref: z.string(),
};

/**
 * One page of a directory search (search_contacts, search_groups), answered as both answer it: the
 * entries under `key`, each with the connector that answered as its `source`; `empty` when none
 * matched; the signed cursor of the next page; the count in the audit row. `query` is what the cursor
 * is bound to, beside the connector's source.
 */
export async function directoryPage<K extends string, T extends object>(
  ctx: ReadContext,
  opts: {
    tool: string;
    key: K;
    preference: SourcePreference;
    query: Record<string, unknown>;
    cursor: string | undefined;
    fetch(connector: Connector, after: unknown): Promise<{ items: T[]; next: unknown }>;
  },
): Promise<ToolOutcome<Record<K, (T & { source: string })[]>>> {
  const connector = ctx.connectors.pick(opts.preference);
  const query = { ...opts.query, source: connector.source };
  const page = await ctx.cursors.page(opts.tool, query, opts.cursor, (after) => opts.fetch(connector, after));
  const entries = page.items.map((item) => ({ ...item, source: connector.source }));
  return {
    data: { [opts.key]: entries } as Record<K, (T & { source: string })[]>,
    empty: page.items.length === 0,
    next_cursor: page.next_cursor,
    audit: { source: connector.source, details: { count: page.items.length } },
  };
}
