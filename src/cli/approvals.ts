import { Option, type Command } from 'commander';
import { CHOICES } from '../admin/cli-input.ts';
import type { AdminResults } from '../admin/commands.ts';
import { agentToolName } from '../core/tool-names.ts';
import { countHiddenIn, marked } from '../core/visible.ts';
import { chairPassword, config, out, usageError } from './io.ts';
import { runData } from './run-data.ts';

/** A chair's commands (docs/approvals.md): the requests, and the decisions on them. */

/** A request as a chair reads it: agent-supplied text with every invisible character as a marker. */
function printApproval(a: AdminResults['approvals.show']['approval'], prefix: string): void {
  const { target_flags: flags, ...shown } = (a.review ?? {}) as Record<string, unknown>;
  const hidden = countHiddenIn([a.target.target_id, a.target.display_name, shown]);
  out(`request     ${a.approval_request_id}`);
  out(`status      ${a.status}${a.approval_id ? `  (approval_id ${a.approval_id})` : ''}`);
  out(`tool        ${agentToolName(a.tool, prefix)}   agent ${a.agent_name}`);
  if (hidden > 0) {
    out(
      `WARNING     ${hidden} invisible or reordering character(s), each shown as a marker such as ⟦U+202E …⟧`,
    );
  }
  out(
    `target      ${marked(`${a.target.target_type} ${a.target.target_id} (${a.target.display_name ?? '?'})`)}`,
  );
  for (const l of lookalikes(flags)) out(`looks like  ${marked(`${l.display_name} (${l.target_id})`)}`);
  out(`source      ${a.source ?? '(not recorded)'}`);
  out(`rule        ${a.rule.asks}`);
  out(`approvers   ${a.approvers.join(', ') || '-'} (${a.rule.progress})`);
  if (a.viewer && !a.viewer.may) out(`read-only   ${a.viewer.reason}`);
  out(`created     ${a.created_at}   expires ${a.expires_at}`);
  if (a.note) out(`note        ${marked(a.note)}`);
  if (a.review) out(`content     ${marked(JSON.stringify(shown, null, 2))}`);
}

/** The directory entries a request's target looks like (review.target_flags.looks_like). */
function lookalikes(flags: unknown): { target_id: string; display_name: string }[] {
  const list = (flags as { looks_like?: unknown } | undefined)?.looks_like;
  return Array.isArray(list) ? (list as { target_id: string; display_name: string }[]) : [];
}

/** `approvals list|show|approve|reject`, as a chair signed in with a password. */
export function addApprovalCommands(cli: Command): void {
  const approvals = cli
    .command('approvals')
    .description(
      'review and decide approval requests as a chair (password from COUNTERSIGN_PASSWORD or stdin)',
    );
  approvals
    .command('list')
    .requiredOption('--as <user>', 'your user name')
    .addOption(new Option('--status <status>', 'which requests').choices(CHOICES.status).default('pending'))
    .option(
      '--waiting-for-me',
      'only requests you can decide now (pending, undecided by you, a rule you are among)',
    )
    .action(async (opts: { as: string; status: string; waitingForMe?: boolean }) => {
      const password = await chairPassword();
      const cfg = config();
      const { approvals: rows } = await runData(cfg, {
        command: 'approvals.list',
        as: opts.as,
        password,
        status: opts.status,
        waiting_for_me: opts.waitingForMe,
      });
      if (rows.length === 0) out(`no ${opts.status} requests`);
      for (const a of rows) {
        out(
          `${a.approval_request_id}\t${a.status}\t${agentToolName(a.tool, cfg.tools.prefix)}\t${a.agent_name}\t` +
            `${a.target.target_type}:${a.target.target_id}\t${a.created_at}\texpires ${a.expires_at}`,
        );
      }
    });
  approvals
    .command('show')
    .argument('<id>', 'approval request id')
    .requiredOption('--as <user>', 'your user name')
    .action(async (id: string, opts: { as: string }) => {
      const password = await chairPassword();
      const cfg = config();
      const { approval } = await runData(cfg, { command: 'approvals.show', as: opts.as, password, id });
      printApproval(approval, cfg.tools.prefix);
    });
  for (const decision of ['approve', 'reject'] as const) {
    approvals
      .command(decision)
      .argument('<id>', 'approval request id')
      .requiredOption('--as <user>', 'your user name (must hold the chair role)')
      .option(
        '--note <text>',
        decision === 'reject' ? 'why (required)' : 'a note for the agent and the audit log',
      )
      .action(async (id: string, opts: { as: string; note?: string }) => {
        if (decision === 'reject' && !opts.note) throw usageError('reject needs --note');
        const password = await chairPassword();
        const { approval } = await runData(config(), {
          command: 'approvals.decide',
          as: opts.as,
          password,
          id,
          decision,
          note: opts.note,
        });
        // After the first of several approvals, how far it is: "pending (1 of 2 approvals)".
        const tally =
          approval.status === 'pending' && approval.required_approvers > 1
            ? ` (${approval.approvers.length} of ${approval.required_approvers} approvals)`
            : '';
        out(`${approval.approval_request_id} is ${approval.status}${tally}`);
        if (approval.approval_id) out(approval.approval_id);
      });
  }
}
