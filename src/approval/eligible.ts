import type { Knex } from 'knex';
import { heldBy } from '../accounts/index.ts';
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
  q: Knex | Knex.Transaction,
  restriction: Restriction,
  names: string[],
): Promise<string[]> {
  const held = await heldBy(q, names);
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
