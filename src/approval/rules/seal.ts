import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import type { Transaction } from '../../db/knex.ts';
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
  /**
   * The seq of the policy.changed row of the change that stored it (or the log's head when it was sealed
   * at an upgrade): bound by the seal, so that a policy put back as it was before a later change meets
   * that change's row (POLICY_LAST_CHANGE_SQL). Absent only on a row sealed before seals bound it.
   */
  seq?: number;
  /** policyMac over doc, version and seq; absent only on a row stored before policies were sealed. */
  mac?: string;
}

/** The canonical text a stored policy's seal is made over. */
export const policySealedText = (doc: unknown, version: string | undefined, seq: number | undefined) =>
  canonicalize({ v: 2, setting: POLICY_SETTING, doc, version: version ?? null, seq: seq ?? null })!;

/** The text of the seal before it bound the change's seq (v1): verified only by the upgrade. */
const v1Text = (doc: unknown, version: string | undefined) =>
  canonicalize({ v: 1, setting: POLICY_SETTING, doc, version: version ?? null })!;

export const policyMac = (roots: HostRoots, doc: unknown, version: string | undefined, seq: number) =>
  roots.mac('policy', policySealedText(doc, version, seq));

/** POLICY_LAST_CHANGE_SQL's value, as read. */
export interface LastPolicyChange {
  seq: number;
  /** Absent from rows appended before policy.changed recorded it. */
  most_approvers?: number;
}

export function lastChangeOf(raw: unknown): LastPolicyChange | undefined {
  const v = (typeof raw === 'string' ? JSON.parse(raw) : raw) as
    { seq: unknown; most_approvers: unknown } | null | undefined;
  if (v === null || v === undefined) return undefined;
  return {
    seq: Number(v.seq),
    ...(typeof v.most_approvers === 'number' ? { most_approvers: v.most_approvers } : {}),
  };
}

/**
 * Whether a stored policy (or none: undefined) may be applied: it carries its seal and no later change
 * is in the log, or it was stored before policies were sealed and the host roots do not yet say they
 * are (`policy_sealed`, written by the upgrade's start). No policy stored is right only while the log
 * holds no policy.changed: a stored policy deleted by SQL would otherwise give way to the config file's.
 */
export function policySealed(
  roots: HostRoots,
  stored: StoredPolicy | undefined,
  last: LastPolicyChange | undefined,
): boolean {
  if (stored === undefined) return last === undefined;
  if (!roots.policySealed && stored.mac === undefined) return true;
  if (!roots.verify('policy', policySealedText(stored.doc, stored.version, stored.seq), stored.mac))
    return false;
  return last === undefined || (stored.seq !== undefined && last.seq <= stored.seq);
}

/**
 * Seals, once at the upgrade, a stored policy that has no seal (before `policy_sealed`), or whose seal
 * is the earlier kind and verifies as such (before `policy_fresh`), binding `head`, the log's head. One
 * with a wrong seal is left as it is: it stays TAMPERED.
 */
export async function sealUnsealedPolicy(
  trx: Transaction,
  roots: HostRoots,
  head: number,
): Promise<{ sealed: boolean }> {
  const stored = (await readSetting(trx, POLICY_SETTING, { forUpdate: true })) as StoredPolicy | undefined;
  if (stored === undefined || stored.seq !== undefined) return { sealed: false };
  const due =
    (stored.mac === undefined && !roots.policySealed) ||
    roots.verify('policy', v1Text(stored.doc, stored.version), stored.mac);
  if (!due) return { sealed: false };
  const mac = policyMac(roots, stored.doc, stored.version, head);
  await writeSetting(trx, POLICY_SETTING, { ...stored, seq: head, mac });
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
