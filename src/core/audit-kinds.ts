import { z } from 'zod';

/** Every kind of audit row; docs/audit.md lists each and what its `details` hold. */
export const AuditKind = z.enum([
  'tool.call',
  'auth.denied',
  'auth.denied_summary',
  'approval.requested',
  'approval.approved',
  'approval.rejected',
  'approval.expired',
  'write.started',
  'write.succeeded',
  'write.failed',
  'write.unknown',
  'agent.created',
  'agent.profile_changed',
  'agent.rate_limit_changed',
  'agent.owner_changed',
  'agent.token_rotated',
  'agent.revoked',
  'user.created',
  'user.role_changed',
  'user.password_reset',
  'user.disabled',
  'user.email_changed',
  'user.linked',
  'user.login',
  'user.login_failed',
  'export.created',
  'checkpoint',
  'audit.tampered',
  'server.started',
  'server.stopped',
  'notification.delivered',
  'notification.failed',
  'slack.refused',
  'upstream.tool_classified',
  'upstream.classification_changed',
  'upstream.classification_accepted',
]);
export type AuditKind = z.infer<typeof AuditKind>;

/** How the action an audit row records ended. */
export const AuditResult = z.enum(['ok', 'error']);
export type AuditResult = z.infer<typeof AuditResult>;
