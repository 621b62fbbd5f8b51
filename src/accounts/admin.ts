import type { Connection, Transaction } from '../db/knex.ts';
import type { AuditInput, AuditLog } from '../audit/index.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { hostRootsOf } from '../db/host-roots.ts';
import { writeSetting } from '../db/settings.ts';
import { auditTampered, recordOfTampered, resealAgent, resealUser, sealAfterChange } from './authority.ts';
import {
  activeAgentNamed,
  agentNamedForUpdate,
  countAgents,
  createAgent,
  listAgents,
  ownerNamed,
  revokeAgent,
  rotateAgentToken,
  updateAgent,
} from './agents.ts';
import {
  changeUser,
  countUsers,
  createUser,
  linkIdentity,
  listUsers,
  setUserEmail,
  setUserTeams,
  userNameOf,
  type UserChange,
} from './users.ts';

/** An operator's audit row: what happened, who did it, to which agent. Its result is always ok. */
export type AccountRow = Pick<AuditInput, 'kind' | 'actor' | 'agent_id' | 'details'>;

type Rest<F> = F extends (q: never, ...rest: infer A) => infer R ? (...rest: A) => R : never;

/**
 * What one operator command may change about agents and users, every step in the same transaction as
 * its audit rows. The command composes the steps; the store owns the tables.
 */
export interface AccountChanges {
  createAgent: Rest<typeof createAgent>;
  /** The agent by name with its row locked for this change (revoked or not). */
  agentNamedForUpdate: Rest<typeof agentNamedForUpdate>;
  activeAgentNamed: Rest<typeof activeAgentNamed>;
  ownerNamed: Rest<typeof ownerNamed>;
  updateAgent: Rest<typeof updateAgent>;
  revokeAgent: Rest<typeof revokeAgent>;
  rotateAgentToken: Rest<typeof rotateAgentToken>;
  countUsers: () => Promise<number>;
  createUser: Rest<typeof createUser>;
  changeUser: (name: string, change: UserChange) => ReturnType<typeof changeUser>;
  setUserEmail: Rest<typeof setUserEmail>;
  setUserTeams: Rest<typeof setUserTeams>;
  linkIdentity: Rest<typeof linkIdentity>;
  /** Seals the user's record as it now stands (the operator's `user reseal`): the fields it sealed. */
  resealUser: (name: string) => ReturnType<typeof resealUser>;
  /** Seals the agent's record as it now stands (`agent reseal`). */
  resealAgent: (name: string) => ReturnType<typeof resealAgent>;
  userNameOf: Rest<typeof userNameOf>;
  /** Records a setting that describes what this change made (the first run's record of its accounts). */
  writeSetting: (name: string, value: object) => Promise<void>;
  /**
   * Appends an audit row (result ok) that commits with the change, or not at all; a row that says a user
   * or an agent changed seals that record again, binding the row's seq.
   */
  audit: (row: AccountRow) => Promise<unknown>;
}

/** The accounts as the operator's commands see them: reads, and changes in a unit of work. */
export interface AccountAdmin {
  /** Runs `work` in one transaction: its changes and its audit rows commit together, or neither does. */
  change<T>(work: (tx: AccountChanges) => Promise<T>): Promise<T>;
  listAgents: () => ReturnType<typeof listAgents>;
  listUsers: () => ReturnType<typeof listUsers>;
  countAgents: () => Promise<number>;
  /** The active (unrevoked) agent by name. */
  activeAgentNamed: (name: string) => ReturnType<typeof activeAgentNamed>;
}

/** Roots a change may need: the host's keys that agent tokens are made and stored under. */
type Roots = () => Promise<HostRoots>;

function changesIn(trx: Transaction, audit: AuditLog, roots: HostRoots): AccountChanges {
  return {
    createAgent: (opts) => createAgent(trx, opts, roots),
    agentNamedForUpdate: (name) => agentNamedForUpdate(trx, name),
    activeAgentNamed: (name) => activeAgentNamed(trx, name),
    ownerNamed: (name) => ownerNamed(trx, name),
    updateAgent: (name, change) => updateAgent(trx, name, change, roots),
    revokeAgent: (name) => revokeAgent(trx, name, roots),
    rotateAgentToken: (name) => rotateAgentToken(trx, name, roots),
    countUsers: () => countUsers(trx),
    createUser: (opts) => createUser(trx, opts, roots),
    changeUser: (name, change) => changeUser(trx, name, change, roots),
    setUserEmail: (name, email) => setUserEmail(trx, name, email, roots),
    setUserTeams: (name, teams) => setUserTeams(trx, name, teams, roots),
    linkIdentity: (name, identity) => linkIdentity(trx, name, identity, roots),
    resealUser: (name) => resealUser(trx, roots, name),
    resealAgent: (name) => resealAgent(trx, roots, name),
    userNameOf: (id) => userNameOf(trx, id),
    writeSetting: (name, value) => writeSetting(trx, name, value),
    // A row that says a record changed seals the record again, binding the row's seq (sealAfterChange).
    audit: async (row) => {
      const appended = await audit.appendIn(trx, { ...row, result: 'ok' });
      for (const r of appended) await sealAfterChange(trx, roots, r);
      return appended;
    },
  };
}

export function createAccountAdmin(
  knex: Connection,
  audit: AuditLog,
  roots: Roots = () => hostRootsOf(knex),
): AccountAdmin {
  return {
    // The roots are opened before the transaction: opening them the first time reads the database,
    // which on PGlite (one connection) would wait for the transaction that waits for it.
    // A change refused because a record it read is not sealed as it stands (TAMPERED) is recorded after
    // its transaction rolled back: the refusal leaves its row, the change none.
    change: async (work) => {
      const opened = await roots();
      try {
        return await knex.transaction((trx) => work(changesIn(trx, audit, opened)));
      } catch (err) {
        const record = recordOfTampered(err);
        if (record) await auditTampered(audit, record.kind, record.name, 'change');
        throw err;
      }
    },
    listAgents: async () => listAgents(knex, await roots()),
    listUsers: async () => listUsers(knex, await roots()),
    countAgents: () => countAgents(knex),
    activeAgentNamed: (name) => activeAgentNamed(knex, name),
  };
}
