import { z } from 'zod';
import { SourcePreference } from '../connectors/index.ts';

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
  'Which connector to read from: auto (the configured one), local, bridge, local_readonly, uia, network.',
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
