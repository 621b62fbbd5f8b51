import { z } from 'zod';
import { SourcePreference } from '../connectors/index.ts';

/**
 * Inputs of which a call must give at least one argument of a group (a refine checks it). Each argument's
 * description says so, which is what tools/list shows; this registry tells the tool reference
 * (scripts/tool-reference.ts). Not a JSON Schema `anyOf`: some clients refuse one at the top of a tool's
 * input schema.
 */
export const oneRequired = z.registry<{ fields: readonly string[] }>();

/** `limit`: at least 1; values above the contract maximum are clamped, not refused (INV-TOOL5). */
export const limitParam = (fallback: number, max: number) =>
  z
    .number()
    .int()
    .min(1)
    .default(fallback)
    .transform((n) => Math.min(n, max))
    .describe(`Page size, default ${fallback}, max ${max}; larger values are clamped to ${max}.`);

export const cursorParam = z
  .string()
  .min(1)
  .max(2048)
  .optional()
  .describe('Opaque cursor from a previous page (next_cursor); only valid with the same query.');

export const sourcePreferenceParam = SourcePreference.default('auto').describe(
  'Which connector to read from: auto (default: the one this server is configured with), local (the ' +
    "built-in store), bridge (a messenger's HTTP bridge), or the messenger contract's local_readonly, uia " +
    'and network. A source this server has not configured answers SOURCE_UNAVAILABLE, naming the ones it has.',
);

export const idParam = (what: string) => z.string().min(1).max(256).describe(what);

/** Free text to match; trimmed, never empty. */
export const queryText = z
  .string()
  .max(256)
  .transform((s) => s.trim())
  .pipe(z.string().min(1, 'must not be blank'));

/** The `source` reported per item: the connector that answered (`local`, `bridge` or `mcp:<upstream>`). */
export const sourceField = z.string().describe('Connector that answered: local, bridge or mcp:<upstream>.');
