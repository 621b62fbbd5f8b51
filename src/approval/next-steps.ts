import { AppError } from '../core/errors.ts';
import { isUuid } from '../core/ids.ts';
import type { RefusalReason } from './execute.ts';

/**
 * What an agent does after each refusal of a real run, naming the tools as it calls them (`get` is
 * get_approval under the configured prefix). Undefined where the refusal's own message says it already.
 */
const STEPS: Record<RefusalReason, ((get: string) => string) | undefined> = {
  missing: (get) =>
    `call this tool with dry_run: true to draft the write; once a chair approves, ${get} gives the approval_id`,
  unknown: (get) =>
    `check the id: ${get} with your approval_request_id shows the approval_id once a chair approved; ` +
    'or draft the write again with dry_run: true',
  pending: (get) =>
    `wait for a chair to decide: ${get} shows its status; repeat this call once it is approved`,
  rejected: () => 'do not repeat it: draft another write with dry_run: true, or ask the chair why',
  expired: undefined,
  consumed: (get) =>
    `an approval executes one write: ${get} with this approval_id shows what happened to it; ` +
    'to write again, draft it again with dry_run: true for a new approval',
  mismatch: (get) =>
    `repeat the call with exactly the approved arguments (${get} shows the approved tool, target and ` +
    'content_sha256), or draft these arguments with dry_run: true for a new approval',
  wrong_agent: () => 'use an approval this agent drafted: draft the write with dry_run: true',
  approver_disabled: undefined,
  approver_not_eligible: undefined,
  policy_changed: (get) => `${get} shows its status; repeat this call once it is approved again`,
};

const isRefusalReason = (reason: string | undefined): reason is RefusalReason =>
  reason !== undefined && Object.hasOwn(STEPS, reason);

/** The next step for a refusal's reason, or undefined when it has none beyond its message. */
export function refusalStep(reason: string | null | undefined, getApprovalTool: string): string | undefined {
  const r = reason ?? undefined;
  return isRefusalReason(r) ? STEPS[r]?.(getApprovalTool) : undefined;
}

/**
 * An APPROVAL_REQUIRED refusal with what to do next: in its message ("…; next: …") and, where the
 * approval is named, as `details.next_step` ({tool, arguments}) as an unknown outcome carries it.
 * Anything else is returned as it is.
 */
export function withNextStep(err: unknown, getApprovalTool: string, approval_id?: string): unknown {
  if (!(err instanceof AppError) || err.code !== 'APPROVAL_REQUIRED') return err;
  const step = refusalStep(err.reason, getApprovalTool);
  if (!step) return err;
  const named = approval_id !== undefined && isUuid(approval_id) && LOOKED_UP.has(err.reason!);
  const details = named
    ? { ...err.details, next_step: { tool: getApprovalTool, arguments: { approval_id } } }
    : err.details;
  return new AppError(err.code, `${err.message}; next: ${step}`, err.reason, { cause: err.cause, details });
}

/** The refusals of an approval this agent holds, whose state get_approval shows. */
const LOOKED_UP = new Set<string>([
  'consumed',
  'mismatch',
  'pending',
  'policy_changed',
] satisfies RefusalReason[]);
