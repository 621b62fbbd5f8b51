import { z } from 'zod';
import { ApprovalSummary, Preflight, Target } from '../../approval/view.ts';
import { SourcePreference } from '../../connectors/index.ts';
import { MessageTargetType } from '../../core/schemas.ts';
import type { ResolvedTarget } from '../../connectors/types.ts';
import type { WriteResult } from '../types.ts';

/** The inputs every write tool shares: the target, the gate's controls and the source. */
export const writeTargetParams = {
  target_type: MessageTargetType,
  target_id: z
    .string()
    .min(1)
    .max(256)
    .describe('The target id; an exact name or account is accepted too if it matches one target.'),
};

export const writeControlParams = {
  approval_id: z
    .string()
    .min(1)
    .max(64)
    .optional()
    .describe(
      'Required when dry_run is false: issued when a chair approves the dry run of exactly this write.',
    ),
  dry_run: z
    .boolean()
    .default(true)
    .describe('Default true: plan the write and request approval; nothing is sent.'),
  idempotency_key: z
    .string()
    .min(1)
    .max(200)
    .optional()
    .describe('Recommended for real writes: the same key with the same content returns the first result.'),
  source_preference: SourcePreference.exclude(['local_readonly']).default('auto'),
};

/** Output fields every write tool shares. */
export const writeOutputFields = {
  dry_run: z.boolean(),
  send_status: z.enum(['planned', 'sent', 'rejected']),
  target: Target,
  content_sha256: z
    .string()
    .describe('SHA-256 of the canonical JSON of the exact write; the approval is bound to it.'),
  approval: ApprovalSummary.nullable().describe('On dry run: the approval request to have approved.'),
  preflight: Preflight.nullable().describe(
    'On a dry run given an approval_id (nothing is drafted or consumed): whether a real run with these arguments would be accepted now, or the code and reason it would be refused with.',
  ),
};

/** The output fields every write tool fills the same way from the gate's result. */
export function writeOutput(r: WriteResult, target: ResolvedTarget) {
  return {
    dry_run: r.dry_run,
    send_status: r.send_status,
    target,
    content_sha256: r.content_sha256,
    approval: r.approval,
    preflight: r.preflight ?? null,
    message_ref: (r.result?.message_ref as string | undefined) ?? null,
  };
}
