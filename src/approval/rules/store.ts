import type { Knex } from 'knex';
import type { AuditLog } from '../../audit/index.ts';
import type { Config } from '../../config.ts';
import { readSetting, settingUnchangedSql, writeSetting } from '../../db/settings.ts';
import { retryingTransaction } from '../../db/retry.ts';
import { versionOf, type PolicyDoc } from '../../core/approval-policy.ts';
import { compilePolicy, type CompiledPolicy } from './compile.ts';
import type { PatternRunner } from './patterns.ts';

/** The `settings` row that holds the policy every replica on one database applies. */
const SETTING = 'approval_policy';

/**
 * SQL true while the stored policy document is still the one bound (`?`, a HeldPolicy's `stored`), or
 * none is stored and none is bound (`null`): the one-statement execution start acts only then, so that
 * an edit made within this replica's re-read interval (by another replica, or by hand in the database)
 * is never missed.
 */
export const POLICY_UNCHANGED_SQL = settingUnchangedSql(SETTING, 'doc');

/** A policy as this replica holds it, with the stored document it was compiled from (JSON text). */
export type HeldPolicy = CompiledPolicy & {
  /** The stored document's JSON text as read, or `null` (JSON) for the config file's policy. */
  stored: string;
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

/** A stored policy row: the document as the operator wrote it, its version, and who stored it when. */
interface Stored {
  doc: unknown;
  /** As computed when stored; the version in force is always computed again from `doc`. */
  version?: string;
  changed_by: string;
  changed_at: string;
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
  patterns?: PatternRunner,
): PolicySource {
  const required = config.approval.required_approvers;
  const fromConfig = compilePolicy(config.approval.rules, required, { patterns });
  const configHeld: HeldPolicy = { ...fromConfig, stored: 'null' };
  let last: { policy: HeldPolicy; read_at: number } | undefined;

  const fresh = async (q: Knex | Knex.Transaction = knex): Promise<HeldPolicy> => {
    const stored = (await readSetting(q, SETTING)) as Stored | undefined;
    const text = stored === undefined ? 'null' : JSON.stringify(stored.doc);
    const policy =
      stored === undefined
        ? configHeld
        : last && last.policy.stored === text
          ? last.policy
          : { ...compilePolicy(stored.doc, required, { patterns }), stored: text };
    last = { policy, read_at: Date.now() };
    return policy;
  };

  return {
    fresh,
    current: async () => (last && Date.now() - last.read_at < REREAD_MS ? last.policy : fresh()),
    origin: async (q = knex) => ((await readSetting(q, SETTING)) === undefined ? 'config' : 'database'),
    set: async (doc, actor) => {
      const next = compilePolicy(doc, required, { patterns });
      const versions = await retryingTransaction(knex, async (trx) => {
        // Whatever is stored now is replaced, even a policy that no longer compiles.
        const before = await versionStored(trx, fromConfig, required);
        const row: Stored = {
          doc: next.doc,
          version: next.version,
          changed_by: actor,
          changed_at: new Date().toISOString(),
        };
        await writeSetting(trx, SETTING, row);
        await audit.appendIn(trx, {
          kind: 'policy.changed',
          actor,
          result: 'ok',
          details: { version_before: before, version_after: next.version, rules: next.doc.rules.length },
        });
        return { before, after: next.version, changed: before !== next.version };
      });
      last = undefined;
      return versions;
    },
  };
}

/**
 * The version of the policy stored now (or of the config file's, when none is stored): the hash of its
 * text as stored, so that the audit row names what was there even if it was edited by hand.
 */
async function versionStored(
  trx: Knex.Transaction,
  fromConfig: CompiledPolicy,
  required: Readonly<Record<string, number>>,
): Promise<string> {
  const stored = (await readSetting(trx, SETTING)) as Stored | undefined;
  return stored === undefined ? fromConfig.version : versionOf(stored.doc as PolicyDoc, required);
}
