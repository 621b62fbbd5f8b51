import { z } from 'zod';
import { AuditKind, AuditResult } from './kinds.ts';

/** Which rows an export holds (every row when empty). */
export const ExportFilter = z.strictObject({
  since: z.iso.datetime({ offset: true }).optional(),
  until: z.iso.datetime({ offset: true }).optional(),
  agent_id: z.string().min(1).optional(),
  tool: z.string().min(1).optional(),
  kind: AuditKind.optional(),
  result: AuditResult.optional(),
});
export type ExportFilter = z.infer<typeof ExportFilter>;
