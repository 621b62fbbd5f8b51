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
  'audit.restore_accepted',
  'server.started',
  'server.stopped',
  'notification.delivered',
  'notification.failed',
  'slack.refused',
  'upstream.tool_classified',
  'upstream.classification_changed',
  'upstream.classification_accepted',
  'policy.changed',
  'policy.tampered',
  'approval.reopened',
  'user.teams_changed',
  'approval.withdrawn',
  'user.record_tampered',
  'agent.record_tampered',
  'user.resealed',
  'agent.resealed',
]);
export type AuditKind = z.infer<typeof AuditKind>;

/** How the action an audit row records ended. */
export const AuditResult = z.enum(['ok', 'error']);
export type AuditResult = z.infer<typeof AuditResult>;

/**
 * What a tool call's audit row records beyond the call itself, as a handler or the approval gate
 * reports it (the one declaration: tools, the gate, the call seam and the envelope all take it).
 */
export interface AuditFacts {
  /** The connector that answered: local, bridge or mcp:<upstream>. */
  source?: string;
  target_type?: string | null;
  target_ref?: string | null;
  dry_run?: boolean;
  content_sha256?: string | null;
  file_sha256?: string | null;
  approval_id?: string | null;
  details?: Record<string, unknown>;
}

/** The facts as the row's columns hold them: each one that was not reported is null (dry_run: false). */
export function factColumns(facts: AuditFacts) {
  return {
    source: facts.source ?? null,
    target_type: facts.target_type ?? null,
    target_ref: facts.target_ref ?? null,
    approval_id: facts.approval_id ?? null,
    dry_run: facts.dry_run ?? false,
    content_sha256: facts.content_sha256 ?? null,
    file_sha256: facts.file_sha256 ?? null,
  };
}
