import type { Queryable } from '../db/knex.ts';
import { heldBy } from '../accounts/index.ts';
import type { HostRoots } from '../core/host-roots.ts';
import type { Requirement } from './rules/index.ts';
import type { RequestRow } from './view.ts';

/** Who a rule lets approve: people holding one of `roles` (built-in roles or teams), or named in `users`. */
export type Restriction = { roles: string[] } | { users: string[] };

/** The restriction of the rule a request was drafted under; undefined when any chair may approve. */
export function restrictionOf(row: Pick<RequestRow, 'policy_requirement'>): Restriction | undefined {
  const req = row.policy_requirement as Requirement | null;
  if (!req || req.kind !== 'require') return undefined;
  if (req.roles) return { roles: req.roles };
  if (req.users) return { users: req.users };
  return undefined;
}

/** Of `names` (in order), those the restriction accepts, as active users now. */
export async function eligibleApprovers(
  q: Queryable,
  restriction: Restriction,
  names: string[],
  roots: HostRoots,
): Promise<string[]> {
  // A user whose record was changed by SQL (roles, teams: docs/identity.md, "Sealed records") holds nothing.
  const held = await heldBy(q, names, roots);
  return names.filter((n) => {
    const holds = held.get(n);
    if (!holds) return false;
    return 'users' in restriction
      ? restriction.users.includes(n)
      : restriction.roles.some((r) => holds.includes(r));
  });
}

/** The restriction in words: "finance or legal", "ada or ben". */
export const whoMayApprove = (r: Restriction): string =>
  'users' in r ? `users ${r.users.join(' or ')}` : `holders of ${r.roles.join(' or ')}`;

/** A requirement in words, for chairs and operators: "2 of finance", "1 of users ada or ben", "refused: …". */
export function describeRequirement(req: Requirement): string {
  if (req.kind === 'deny') return `refused: ${req.reason}`;
  if (req.kind === 'allow_without_review') return `no review: ${req.reason}`;
  if (req.roles) return `${req.approvers} of ${req.roles.join(' or ')}`;
  if (req.users) return `${req.approvers} of users ${req.users.join(' or ')}`;
  return `${req.approvers} ${req.approvers === 1 ? 'chair' : 'chairs'}`;
}

/** Why a request needs whom it needs, and how far it is: what the review page, the CLI and notices show. */
export interface RuleSummary {
  /** The approval rule that matched; null when none did (the per-tool default). */
  rule: string | null;
  policy_version: string;
  /** "Payments over EUR 10,000: 2 of finance", or "2 chairs" under the default. */
  asks: string;
  /** Approvals that count towards it (by people the rule accepts). */
  counted: number;
  required: number;
  /** "1 of 2 from finance". */
  progress: string;
}

/** The summary of a request with these approvers (in decision order). */
export async function ruleSummaryOf(
  q: Queryable,
  row: Pick<RequestRow, 'policy_rule' | 'policy_requirement' | 'policy_version' | 'required_approvers'>,
  approvers: string[],
  roots: HostRoots,
): Promise<RuleSummary> {
  const req = (row.policy_requirement as Requirement | null) ?? {
    kind: 'require' as const,
    approvers: row.required_approvers,
  };
  const restriction = restrictionOf(row);
  const counted = restriction
    ? (await eligibleApprovers(q, restriction, approvers, roots)).length
    : approvers.length;
  const words = describeRequirement(req);
  const from = restriction
    ? ` from ${'roles' in restriction ? restriction.roles.join(' or ') : 'those named'}`
    : '';
  return {
    rule: row.policy_rule,
    policy_version: row.policy_version,
    asks: row.policy_rule ? `${row.policy_rule}: ${words}` : words,
    counted,
    required: row.required_approvers,
    progress: `${counted} of ${row.required_approvers}${from}`,
  };
}

/**
 * Whether `user` may decide a request under its rule, and if not why: the review page shows such a
 * chair the request read-only with this reason.
 */
export async function mayDecide(
  q: Queryable,
  row: Pick<RequestRow, 'policy_rule' | 'policy_requirement'>,
  userName: string,
  roots: HostRoots,
): Promise<{ may: boolean; reason: string | null }> {
  const restriction = restrictionOf(row);
  if (!restriction || (await eligibleApprovers(q, restriction, [userName], roots)).length > 0)
    return { may: true, reason: null };
  return {
    may: false,
    reason: `approval rule "${row.policy_rule}" asks for ${whoMayApprove(restriction)}; ${userName} is not among them`,
  };
}
