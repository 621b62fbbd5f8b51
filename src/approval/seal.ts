import canonicalize from 'canonicalize';
import type { HostRoots } from '../core/host-roots.ts';
import { AppError } from '../core/errors.ts';
import type { RequestRow } from './view.ts';

/**
 * The MAC a decision carries (approval_requests.decision_mac), made when it commits under the host's
 * decision key: over what was approved (the request, tool, source, target as the chair saw it, content,
 * agent, policy version and rule) and the decision (approval_id, approvers, expiry). The key is on the
 * host, never in the database: a row set to approved by SQL, or one whose binding, approvers or expiry
 * were changed after the decision, has no MAC that matches, and execution refuses it (TAMPERED).
 */
type Binding = Pick<
  RequestRow,
  | 'id'
  | 'tool'
  | 'source'
  | 'target_type'
  | 'target_id'
  | 'target_display'
  | 'content_sha256'
  | 'file_sha256'
  | 'agent_id'
  | 'policy_version'
  | 'policy_rule'
>;

export interface Decided {
  approval_id: string;
  approvers: readonly string[];
  expires_at: string;
}

function sealedText(row: Binding, decided: Decided): string {
  return canonicalize({
    v: 1,
    request: row.id,
    tool: row.tool,
    source: row.source,
    target_type: row.target_type,
    target_id: row.target_id,
    target_display: row.target_display,
    content_sha256: row.content_sha256,
    file_sha256: row.file_sha256,
    agent_id: row.agent_id,
    policy_version: row.policy_version,
    policy_rule: row.policy_rule ?? null,
    approval_id: decided.approval_id,
    approvers: [...decided.approvers].sort(),
    expires_at: new Date(decided.expires_at).toISOString(),
  })!;
}

/** The MAC of this decision on this request. */
export const sealDecision = (roots: HostRoots, row: Binding, decided: Decided): string =>
  roots.mac('decision', sealedText(row, decided));

export type SealProblem = 'decision_unsealed' | 'decision_forged';

/** What is wrong with an approved row's MAC, given its approvers as stored now; undefined when nothing. */
export function sealProblem(
  roots: HostRoots,
  row: RequestRow,
  approvers: readonly string[],
): SealProblem | undefined {
  if (!row.decision_mac || !row.approval_id) return 'decision_unsealed';
  const decided = { approval_id: row.approval_id, approvers, expires_at: row.expires_at };
  return roots.verify('decision', sealedText(row, decided), row.decision_mac) ? undefined : 'decision_forged';
}

/** The refusal of an approval whose decision the server did not make (or that was changed since). */
export const tamperedDecision = (problem: SealProblem) =>
  new AppError(
    'TAMPERED',
    problem === 'decision_unsealed'
      ? 'this approval carries no decision made by this server: draft the write again and have it approved'
      : 'this approval does not match the decision this server made: it was changed in the database',
    problem,
  );
