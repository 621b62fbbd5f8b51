import { z } from 'zod';
import { ApprovalView } from '../../approval/index.ts';
import { ApprovalStatus } from '../../core/schemas.ts';
import { cursorParam, limitParam } from '../params.ts';
import type { ReadToolDef } from '../types.ts';
import { withAgentToolName } from '../../core/tool-names.ts';

const input = z.strictObject({
  status: ApprovalStatus.optional().describe('Only requests in this state.'),
  limit: limitParam(20, 100),
  cursor: cursorParam,
});

const output = z.object({ approvals: z.array(ApprovalView) });

export const listApprovals = {
  name: 'list_approvals',
  title: 'List approvals',
  description: "This agent's approval requests, newest first, optionally by status.",
  facet: 'approvals',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const query = { status: args.status ?? null };
    const page = await ctx.cursors.page<ApprovalView, { t: string; id: string }>(
      'list_approvals',
      query,
      args.cursor,
      (after) => ctx.approvals.listOwn(ctx.agent, { status: args.status, limit: args.limit, after }),
    );
    return {
      data: { approvals: page.items.map((a) => withAgentToolName(a, ctx.config.tools.prefix)) },
      empty: page.items.length === 0,
      next_cursor: page.next_cursor,
      audit: { source: 'local', details: { count: page.items.length } },
    };
  },
} satisfies ReadToolDef<typeof input, typeof output>;
