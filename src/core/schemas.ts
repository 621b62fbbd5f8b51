import { z } from 'zod';

/** What a message or a file can be sent to: the targets a connector resolves. */
export const MessageTargetType = z.enum(['contact', 'group', 'conversation']);
export type MessageTargetType = z.infer<typeof MessageTargetType>;

/**
 * What an approval request or an audit row can name as its target: a message target, or `mcp_tool`,
 * a tool of an upstream MCP server (`<upstream>__<tool>`).
 */
export const TargetType = z.enum([...MessageTargetType.options, 'mcp_tool']);
export type TargetType = z.infer<typeof TargetType>;

/** Every tool belongs to exactly one facet; profiles allow or deny facets. */
export const Facet = z.enum([
  'directory',
  'messages',
  'files',
  'send',
  'approvals',
  'memory',
  'upstream_read',
  'upstream_write',
]);
export type Facet = z.infer<typeof Facet>;

/** Where an approval request stands, from its draft to its write's outcome (docs/design.md). */
export const ApprovalStatus = z.enum([
  'pending',
  'approved',
  'executing',
  'succeeded',
  'failed',
  'unknown',
  'rejected',
  'expired',
]);
export type ApprovalStatus = z.infer<typeof ApprovalStatus>;
