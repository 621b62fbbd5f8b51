import { z } from 'zod';
import { ApprovalView } from '../../approval/index.ts';
import { AppError } from '../../core/errors.ts';
import { oneRequired } from '../params.ts';
import type { ReadToolDef } from '../types.ts';
import { withAgentToolName } from '../../core/tool-names.ts';

const input = z
  .strictObject({
    approval_request_id: z
      .string()
      .min(1)
      .max(64)
      .optional()
      .describe(
        "The request's id, as a write's dry run returned it (approval.approval_request_id). One of " +
          'approval_request_id and approval_id is required.',
      ),
    approval_id: z
      .string()
      .min(1)
      .max(64)
      .optional()
      .describe(
        "The id a chair's approval issued, which a real write passes as its approval_id. One of " +
          'approval_request_id and approval_id is required.',
      ),
  })
  .refine((a) => a.approval_request_id !== undefined || a.approval_id !== undefined, {
    message: 'give approval_request_id or approval_id',
    path: ['approval_request_id'],
  });

oneRequired.add(input, { fields: ['approval_request_id', 'approval_id'] });

const output = z.object({ approval: ApprovalView });

export const getApproval = {
  name: 'get_approval',
  title: 'Get approval',
  description:
    "One of this agent's approval requests: its status, the approval_id once approved, the approvers, the " +
    "chair's note, expiry and the execution result. The matching read of every write.",
  facet: 'approvals',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const own = await ctx.approvals.getOwn(ctx.agent, args);
    // Another agent's request is indistinguishable from a missing one.
    if (!own)
      throw new AppError('TARGET_NOT_FOUND', 'no such approval request for this agent', 'approval_not_found');
    const approval = withAgentToolName(own, ctx.config.tools.prefix);
    return {
      data: { approval },
      audit: {
        source: 'local',
        target_type: approval.target.target_type,
        target_ref: approval.target.target_id,
        approval_id: approval.approval_id,
        content_sha256: approval.content_sha256,
      },
    };
  },
} satisfies ReadToolDef<typeof input, typeof output>;
