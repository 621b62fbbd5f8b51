import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import type { Knex } from 'knex';
import type { HostRoots } from '../../core/host-roots.ts';
import { readSetting, writeSetting } from '../../db/settings.ts';
import type { PolicyDoc } from '../../core/approval-policy.ts';
import type { CompiledPolicy, Decision } from './compile.ts';

/**
 * The sealed policy (docs/policy.md, "The policy is sealed"): the stored policy row carries `mac`, an
 * HMAC under the host roots' policy key over the document and the version it was stored with, written
 * canonically (RFC 8785, so that jsonb's key order and spacing do not matter). Whoever administers the
 * database without a shell on the host can rewrite the row (a rule to `allow_without_review`, fewer
 * approvers, another team) but cannot make the MAC that matches: the policy is then TAMPERED and every
 * write falls to tamperedPolicy, never to what the row says.
 */

/** The `settings` row that holds the policy every replica on one database applies. */
export const POLICY_SETTING = 'approval_policy';

/** A stored policy row: the document as the operator wrote it, its version, who stored it when, its seal. */
export interface StoredPolicy {
  doc: unknown;
  /** As computed when stored; the version in force is always computed again from `doc`. */
  version?: string;
  changed_by: string;
  changed_at: string;
  /** policyMac over doc and version; absent only on a row stored before policies were sealed. */
  mac?: string;
}

/** The canonical text a stored policy's seal is made over. */
export const policySealedText = (doc: unknown, version: string | undefined) =>
  canonicalize({ v: 1, setting: POLICY_SETTING, doc, version: version ?? null })!;

export const policyMac = (roots: HostRoots, doc: unknown, version: string | undefined) =>
  roots.mac('policy', policySealedText(doc, version));

/**
 * Whether a stored policy may be applied: it carries its seal, or it was stored before policies were
 * sealed and the host roots do not yet say they are (`policy_sealed`, written by the upgrade's start).
 */
export function policySealed(roots: HostRoots, stored: StoredPolicy): boolean {
  if (!roots.policySealed && stored.mac === undefined) return true;
  return roots.verify('policy', policySealedText(stored.doc, stored.version), stored.mac);
}

/**
 * Seals, once at the upgrade, a stored policy that has no seal (one with a seal, right or wrong, is left
 * as it is: a wrong one stays TAMPERED).
 */
export async function sealUnsealedPolicy(
  trx: Knex.Transaction,
  roots: HostRoots,
): Promise<{ sealed: boolean }> {
  const stored = (await readSetting(trx, POLICY_SETTING, { forUpdate: true })) as StoredPolicy | undefined;
  if (stored === undefined || stored.mac !== undefined) return { sealed: false };
  await writeSetting(trx, POLICY_SETTING, { ...stored, mac: policyMac(roots, stored.doc, stored.version) });
  return { sealed: true };
}

/** The most approvers any rule of `doc` asks for (0 without such a rule). */
export const mostApprovers = (doc: PolicyDoc) =>
  Math.max(0, ...doc.rules.map((r) => ('require' in r.then ? r.then.require.approvers : 0)));

/**
 * What applies while the stored policy is TAMPERED: no rule at all, so no write is let through without
 * review and none is refused by a rule the database wrote; every write needs the tool's
 * `approval.required_approvers` (else one), and never fewer than `floor`, the most any rule of the last
 * sealed policy this process applied asked for. Its version names it as such, so that requests drafted
 * under it say so and a sealed policy stored again is a new version.
 */
export function tamperedPolicy(
  requiredApprovers: Readonly<Record<string, number>>,
  floor: number,
): CompiledPolicy {
  const doc: PolicyDoc = { timezone: 'UTC', rules: [] };
  const version = createHash('sha256')
    .update(canonicalize({ tampered: true, required_approvers: requiredApprovers, floor })!)
    .digest('hex');
  const defaultFor = (tool: string): Decision => ({
    rule: null,
    requirement: { kind: 'require', approvers: Math.min(5, Math.max(requiredApprovers[tool] ?? 1, floor)) },
    version,
  });
  return {
    doc,
    version,
    defaultFor,
    decide: async (facts) => defaultFor(facts.tool),
    decideInput: async (input) => defaultFor(input.tool),
  };
}
