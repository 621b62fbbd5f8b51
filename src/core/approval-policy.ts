import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { z } from 'zod';

/**
 * The approval policy as an operator writes it (config `approval.rules`, `countersign policy set|check
 * FILE`): an ordered list of rules, the first whose `when` holds decides who must countersign. Only the
 * shape is checked here, in core so that the config schema holds it; src/approval/rules/ compiles and
 * type-checks the expressions.
 */

const RuleName = z
  .string()
  .min(1)
  .max(100)
  .regex(/^[^\p{C}]+$/u, 'no control or invisible characters');

const Reason = z.string().min(1).max(500);

/** N distinct people, each holding one of `roles` or named in `users`; the requester's owner never counts. */
const Require = z.strictObject({
  approvers: z.number().int().min(1).max(5),
  roles: z.array(z.string().min(1).max(64)).min(1).optional(),
  users: z.array(z.string().min(1).max(64)).min(1).optional(),
});

export const RuleThen = z.union([
  z.strictObject({ require: Require.refine((r) => !(r.roles && r.users), 'roles or users, not both') }),
  z.strictObject({ deny: z.strictObject({ reason: Reason }) }),
  z.strictObject({ allow_without_review: z.strictObject({ reason: Reason }) }),
]);
export type RuleThen = z.infer<typeof RuleThen>;

export const Rule = z.strictObject({
  name: RuleName,
  /** A CEL expression of type bool over the input (input.ts). */
  when: z.string().min(1).max(4000),
  then: RuleThen,
});
export type Rule = z.infer<typeof Rule>;

export const PolicyDoc = z.strictObject({
  /** The IANA time zone `time.hour` and `time.weekday` are read in (default UTC). */
  timezone: z
    .string()
    .default('UTC')
    .refine((tz) => {
      try {
        new Intl.DateTimeFormat('en-GB', { timeZone: tz });
        return true;
      } catch {
        return false;
      }
    }, 'not a known IANA time zone'),
  rules: z
    .array(Rule)
    .max(200)
    .default([])
    .refine((rules) => new Set(rules.map((r) => r.name)).size === rules.length, 'rule names must be unique'),
});
export type PolicyDoc = z.infer<typeof PolicyDoc>;

/**
 * The version an approval is bound to: SHA-256 of the RFC 8785 canonical JSON of everything that decides
 * who must countersign, the rules and the per-tool default alike. Any edit to either, anywhere (a file,
 * the database), is a new version.
 */
export function versionOf(doc: PolicyDoc, requiredApprovers: Readonly<Record<string, number>>): string {
  const canonical = canonicalize({ policy: doc, required_approvers: requiredApprovers });
  return createHash('sha256').update(canonical!).digest('hex');
}
