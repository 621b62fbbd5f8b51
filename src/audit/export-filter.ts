import { z } from 'zod';
import { AuditKind, AuditResult } from '../core/audit-kinds.ts';

/** Which rows an export holds (every row when empty). */
export const ExportFilter = z.strictObject({
  since: z.iso.datetime({ offset: true }).optional(),
  until: z.iso.datetime({ offset: true }).optional(),
  agent_id: z.string().min(1).optional(),
  tool: z.string().min(1).optional(),
  kind: AuditKind.optional(),
  result: AuditResult.optional(),
  /** Rows about this target (a contact, group, conversation or upstream tool id). */
  target_ref: z.string().min(1).max(256).optional(),
  /** Rows of this approval, named by its approval_request_id or its approval_id. */
  approval: z.string().min(1).max(64).optional(),
});
export type ExportFilter = z.infer<typeof ExportFilter>;
