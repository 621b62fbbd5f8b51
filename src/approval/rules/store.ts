import type { Knex } from 'knex';
import type { AuditLog } from '../../audit/index.ts';
import type { Config } from '../../config.ts';
import type { HostRoots } from '../../core/host-roots.ts';
import { readSetting, readSettingWith, settingUnchangedSql, writeSetting } from '../../db/settings.ts';
import { retryingTransaction } from '../../db/retry.ts';
import { versionOf, type PolicyDoc } from '../../core/approval-policy.ts';
import { compilePolicy, type CompiledPolicy } from './compile.ts';
import type { PatternRunner } from './patterns.ts';
import {
  lastChangeOf,
  mostApprovers,
  policyMac,
  policySealed,
  POLICY_SETTING as SETTING,
  tamperedPolicy,
  type StoredPolicy as Stored,
} from './seal.ts';

/**
 * SQL true while the stored policy document is still the one bound (`?`, a HeldPolicy's `stored`), or
 * none is stored and none is bound (`null`): the one-statement execution start acts only then, so that
 * an edit made within this replica's re-read interval (by another replica, or by hand in the database)
 * is never missed.
 */
/**
 * SQL for what the log says of the policy's last change (a JSON object, or null when it was never
 * changed by `policy set`): the seq of the newest policy.changed row and the most approvers a rule of
 * the policy it stored asked for. Read in the statement that reads the policy (readSettingWith).
 */
export const POLICY_LAST_CHANGE_SQL = `select json_build_object('seq', e.seq,
    'most_approvers', e.details->'most_approvers')
  from audit_events e where e.kind = 'policy.changed' order by e.seq desc limit 1`;

export const POLICY_UNCHANGED_SQL = settingUnchangedSql(SETTING, 'doc');

/** A policy as this replica holds it, with the stored document it was compiled from (JSON text). */
export type HeldPolicy = CompiledPolicy & {
  /** The stored document's JSON text as read, or `null` (JSON) for the config file's policy. */
  stored: string;
  /**
   * The stored policy does not carry its seal (seal.ts): what applies is tamperedPolicy, never the row.
   */
  tampered?: true;
};

/**
 * How long a replica answers from the policy it last read before it reads the row again. A replica
 * that meets a request bound to a version it does not know reads the row at once (fresh()).
 */
const REREAD_MS = 1000;

/** The approval policy in force: the database's once one is stored, else the config file's. */
export interface PolicySource {
  /** The policy in force, read again from the database at most every REREAD_MS. */
  current(): Promise<HeldPolicy>;
  /** The policy in force, read from the database now (inside `q` when given). */
  fresh(q?: Knex | Knex.Transaction): Promise<HeldPolicy>;
  /**
   * Compiles `doc` (refused, naming the rule, if a rule does not compile), stores it for every replica
   * and appends policy.changed in the same transaction. Returns the versions before and after.
   */
  set(doc: unknown, actor: string): Promise<{ before: string; after: string; changed: boolean }>;
  /** Where the policy in force comes from. */
  origin(q?: Knex | Knex.Transaction): Promise<'database' | 'config'>;
}

/**
 * The policy source of one process. The config file's policy is compiled at once, so that a rule that
 * does not compile stops start-up; a stored one is compiled when read, and one that no longer compiles
 * (an edit made in the database by hand) refuses every write until it is fixed, never falls back.
 */
export function createPolicySource(
  knex: Knex,
  config: Config,
  audit: AuditLog,
  roots: () => Promise<HostRoots>,
  patterns?: PatternRunner,
): PolicySource {
  const required = config.approval.required_approvers;
  const fromConfig = compilePolicy(config.approval.rules, required, { patterns });
  const configHeld: HeldPolicy = { ...fromConfig, stored: 'null' };
  let last: { policy: HeldPolicy; key: string; read_at: number } | undefined;
  // The most approvers a rule of the last sealed policy read or stored here asks for: a floor while tampered.
  let floor = mostApprovers(fromConfig.doc);
  // The tampered texts already recorded (policy.tampered), so that each is audited once per process.
  const reported = new Set<string>();

  const tampered = async (
    q: Knex | Knex.Transaction,
    stored: Stored | undefined,
    text: string,
  ): Promise<HeldPolicy> => {
    if (!reported.has(text)) {
      reported.add(text);
      // Read inside a transaction, the row is appended once it ends: PGlite's one connection is its.
      const recorded = auditTampered(audit, stored, floor);
      if (q === knex) await recorded;
    }
    return { ...tamperedPolicy(required, floor), stored: text, tampered: true };
  };

  // The stored row is checked against its seal at every read (an HMAC), and against the log's last
  // policy.changed, read in the same statement: what a database administrator wrote without the host's
  // key, or put back from before a later change, or deleted, is never applied, whatever it says.
  const fresh = async (q: Knex | Knex.Transaction = knex): Promise<HeldPolicy> => {
    const read = await readSettingWith(q, SETTING, POLICY_LAST_CHANGE_SQL);
    const stored = read.value as Stored | undefined;
    const lastChange = lastChangeOf(read.also);
    // The last sealed policy asked for this many approvers at most: never fewer while tampered, also
    // after a restart.
    floor = Math.max(floor, lastChange?.most_approvers ?? 0);
    const text = stored === undefined ? 'null' : JSON.stringify(stored.doc);
    // What the seal covers, with the seal and the log's last change: the compiled policy is reused only
    // while all of it is the same.
    const key = JSON.stringify([text, stored?.version, stored?.seq, stored?.mac, lastChange?.seq ?? null]);
    let policy: HeldPolicy;
    if (last && last.key === key) policy = last.policy;
    else if (!policySealed(await roots(), stored, lastChange)) policy = await tampered(q, stored, text);
    else if (stored === undefined) policy = configHeld;
    else policy = { ...compilePolicy(stored.doc, required, { patterns }), stored: text };
    if (!policy.tampered) floor = mostApprovers(policy.doc);
    last = { policy, key, read_at: Date.now() };
    return policy;
  };

  return {
    fresh,
    current: async () => (last && Date.now() - last.read_at < REREAD_MS ? last.policy : fresh()),
    origin: async (q = knex) => ((await readSetting(q, SETTING)) === undefined ? 'config' : 'database'),
    set: async (doc, actor) => {
      const next = compilePolicy(doc, required, { patterns });
      const key = await roots();
      const versions = await retryingTransaction(knex, async (trx) => {
        // Whatever is stored now is replaced, even a policy that no longer compiles.
        const before = await versionStored(trx, fromConfig, required, key);
        await storeSealed(trx, audit, key, { next, before, actor });
        return {
          before: before.version,
          after: next.version,
          changed: before.version !== next.version || before.tampered,
        };
      });
      last = undefined;
      floor = mostApprovers(next.doc);
      return versions;
    },
  };
}

/**
 * Stores `next` in `trx` with policy.changed: the change's row first, then the policy with its seal
 * binding that row's seq (so that an earlier policy put back meets this row in the log).
 */
async function storeSealed(
  trx: Knex.Transaction,
  audit: AuditLog,
  key: HostRoots,
  change: { next: CompiledPolicy; before: { version: string; tampered: boolean }; actor: string },
): Promise<void> {
  const { next, before, actor } = change;
  const [changed] = await audit.appendIn(trx, {
    kind: 'policy.changed',
    actor,
    result: 'ok',
    details: {
      version_before: before.version,
      version_after: next.version,
      rules: next.doc.rules.length,
      // The floor of approvers while a later policy is TAMPERED (tamperedPolicy).
      most_approvers: mostApprovers(next.doc),
      // Stored over a policy that did not carry its seal: this change is what restored it.
      ...(before.tampered ? { was_tampered: true } : {}),
    },
  });
  const seq = Number(changed!.seq);
  const row: Stored = {
    doc: next.doc,
    version: next.version,
    changed_by: actor,
    changed_at: new Date().toISOString(),
    seq,
    mac: policyMac(key, next.doc, next.version, seq),
  };
  await writeSetting(trx, SETTING, row);
}

/**
 * The version of the policy stored now (or of the config file's, when none is stored): the hash of its
 * text as stored, so that the audit row names what was there even if it was edited by hand.
 */
async function versionStored(
  trx: Knex.Transaction,
  fromConfig: CompiledPolicy,
  required: Readonly<Record<string, number>>,
  roots: HostRoots,
): Promise<{ version: string; tampered: boolean }> {
  const read = await readSettingWith(trx, SETTING, POLICY_LAST_CHANGE_SQL);
  const stored = read.value as Stored | undefined;
  const tampered = !policySealed(roots, stored, lastChangeOf(read.also));
  if (stored === undefined) return { version: fromConfig.version, tampered };
  return { version: versionOf(stored.doc as PolicyDoc, required), tampered };
}

/** Records that the stored policy is TAMPERED and what applies instead (a failure to record is not fatal). */
async function auditTampered(audit: AuditLog, stored: Stored | undefined, floor: number): Promise<void> {
  await audit
    .append({
      kind: 'policy.tampered',
      actor: 'system',
      result: 'error',
      error_code: 'TAMPERED',
      details: {
        reason: 'policy_tampered',
        version_stored: typeof stored?.version === 'string' ? stored.version : null,
        sealed: typeof stored?.mac === 'string',
        ...(stored === undefined ? { deleted: true } : {}),
        applied: 'every write needs review',
        approvers_at_least: Math.max(1, floor),
      },
    })
    .catch(() => undefined);
}
