import { PolicyDoc } from '../core/approval-policy.ts';

/** What of a user decides whether they may approve under a rule. */
export interface Approver {
  name: string;
  roles: readonly string[];
  teams: readonly string[];
  disabled_at: string | null;
}

/**
 * The rules of a policy that no request can get through as the users stand now: a `require` asking
 * more approvers than there are active chairs it accepts (a team or role nobody holds, users who are
 * not chairs or are disabled). One line per rule, naming it, who it asks for and who there is. A
 * document that is not a policy has none (compiling it says what is wrong).
 */
export function unsatisfiableRules(raw: unknown, users: readonly Approver[]): string[] {
  const parsed = PolicyDoc.safeParse(raw ?? {});
  if (!parsed.success) return [];
  const chairs = users.filter((u) => u.disabled_at === null && u.roles.includes('chair'));
  const warnings: string[] = [];
  for (const rule of parsed.data.rules) {
    if (!('require' in rule.then)) continue;
    const { approvers, roles, users: named } = rule.then.require;
    const eligible = chairs.filter((u) =>
      roles
        ? roles.some((r) => u.roles.includes(r) || u.teams.includes(r))
        : named
          ? named.includes(u.name)
          : true,
    );
    if (eligible.length >= approvers) continue;
    const who = roles ? `from ${roles.join(' or ')}` : named ? `from ${named.join(' or ')}` : 'from chairs';
    const there =
      eligible.length === 0
        ? 'no active chair qualifies'
        : `only ${eligible.length} active chair(s) qualify (${eligible.map((u) => u.name).join(', ')})`;
    warnings.push(
      `rule "${rule.name}" asks ${approvers} approval(s) ${who}, but ${there}: no request under it can be ` +
        `approved until ${roles ? 'chairs join it (countersign user set NAME --team TEAM, or --role)' : 'more chairs qualify'}`,
    );
  }
  return warnings;
}
