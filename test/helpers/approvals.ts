import assert from 'node:assert/strict';
import type { Approvals } from '../../src/approval/approvals.ts';
import type { User } from '../../src/core/identity.ts';
import { runCli } from './cli.ts';
import type { Envelope } from './server.ts';

/**
 * A chair who approves: in this process, through the approvals service that the web form and the CLI
 * also call; or at the CLI in a process of its own, for a server whose database this process cannot
 * share (the embedded database allows one process) or a cluster that should see the decision arrive
 * from outside.
 */
export type Chair =
  { approvals: Approvals; user: User } | { env: Record<string, string>; name: string; password: string };

/**
 * `chair` approves the request (given by id, or as the dry run's envelope, which must be ok) and the
 * approval_id the execution needs is returned. This chair's approval must complete the request: where
 * a tool needs two chairs, the test has the first one decide before.
 */
export async function approveAsChair(
  chair: Chair,
  request: string | Envelope,
  note?: string,
): Promise<string> {
  if (typeof request !== 'string') assert.equal(request.ok, true, JSON.stringify(request.error));
  const id: string = typeof request === 'string' ? request : request.approval.approval_request_id;
  if ('approvals' in chair) {
    const view = await chair.approvals.decide({ id, user: chair.user, decision: 'approve', note });
    assert.equal(view.status, 'approved', `request ${id} needs more approvers`);
    return view.approval_id!;
  }
  const res = await runCli(
    ['approvals', 'approve', id, '--as', chair.name, ...(note === undefined ? [] : ['--note', note])],
    { ...chair.env, COUNTERSIGN_PASSWORD: chair.password },
  );
  assert.equal(res.code, 0, res.stderr);
  // The CLI prints the approval_id on its last line, for scripts.
  return res.stdout.trim().split('\n').at(-1)!;
}
