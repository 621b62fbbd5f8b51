import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import { demoData } from '../connectors/index.ts';
import type { AccountChanges } from '../accounts/index.ts';
import type { Settings } from '../db/settings.ts';
import { isAppError } from '../core/errors.ts';
import type { Role } from '../core/identity.ts';
import { runAdminCommand, type AdminDeps } from './commands.ts';

/** Credentials to show once, and the way to record that they were. */
export interface FirstRun {
  token: string;
  /** A chair login, when the first run created the chair. */
  chair?: { name: string; password: string };
  /** An administrator and compliance login (roles admin, compliance), made with the chair. */
  admin?: { name: string; password: string };
  /** New credentials for what an earlier start created but never showed. */
  renewed: boolean;
  /**
   * Records that the banner with these credentials has been written out. Until it is called, every start
   * makes new credentials (the old ones may never have been seen) and shows them instead.
   */
  markShown(): Promise<void>;
}

/** The first run makes what the operator's commands make, through the same stores. */
export type FirstRunDeps = AdminDeps;

/** The actor of what the first run creates and renews. */
const FIRST_RUN = 'first-run';
/** The settings row that remembers what the first run created and whether its banner was shown. */
const SETTING = 'first_run';

/**
 * `generation` counts the credentials made so far: an instance claims a renewal by raising it, and a
 * banner marks only its own generation shown, so two instances starting at once never leave the shown
 * credentials stale.
 */
const FirstRunState = z.object({
  agent: z.string(),
  chair: z.string().nullable(),
  // Absent in the records of first runs from before the admin user was made with the chair.
  admin: z.string().nullable().optional(),
  generation: z.number().int().positive(),
  shown: z.boolean(),
});
type FirstRunState = z.infer<typeof FirstRunState>;

/**
 * On the very first start (no agent has ever been created), seeds the demo directory when the store is
 * empty and creates the `demo` agent and, when there is no user yet, a `chair` user. On a later start
 * whose predecessor never showed them (it failed, or was killed, first), rotates the agent's token and
 * resets the chair's password, so that this start can show working credentials. Once shown, nothing.
 */
export async function firstRun(deps: FirstRunDeps): Promise<FirstRun | undefined> {
  const state = FirstRunState.optional().parse(await deps.settings.read(SETTING));
  if (state?.shown) return undefined;
  return state ? renew(deps, state) : create(deps);
}

const marker = (settings: Settings, state: FirstRunState) => async (): Promise<void> => {
  await settings.replace(SETTING, state, { ...state, shown: true });
};

async function create(deps: FirstRunDeps): Promise<FirstRun | undefined> {
  // A database that had agents before this record existed has had its first run.
  if ((await deps.accounts.countAgents()) > 0) return undefined;
  if (await deps.directory.isEmpty()) await deps.directory.load(demoData());
  try {
    // The agent, the chair and the record of them commit together: no credential exists unrecorded.
    const made = await deps.accounts.change(async (tx) => {
      const created = await tx.createAgent({ name: 'demo' });
      const { agent } = created;
      const facts = {
        agent: agent.name,
        agent_name: agent.name,
        profile: agent.profile,
        owner: null,
        rate_limit_per_min: null,
      };
      await tx.audit({ kind: 'agent.created', actor: FIRST_RUN, agent_id: agent.id, details: facts });
      const people = await createPeople(tx);
      const state: FirstRunState = {
        agent: agent.name,
        chair: people?.chair.name ?? null,
        admin: people?.admin.name ?? null,
        generation: 1,
        shown: false,
      };
      await tx.writeSetting(SETTING, state);
      return { token: created.token, ...people, state };
    });
    // Where isphere_send_file takes its files from: there from the first run on, for the first try.
    fs.mkdirSync(deps.config.files.outbound_dir, { recursive: true, mode: 0o700 });
    return {
      token: made.token,
      chair: made.chair,
      admin: made.admin,
      renewed: false,
      markShown: marker(deps.settings, made.state),
    };
  } catch (err) {
    if (isAppError(err, 'CONFLICT')) return undefined; // another instance created it first
    throw err;
  }
}

/**
 * When there is no user yet: a `chair` (approves the agents' requests) and an `admin` (roles admin and
 * compliance: the audit pages, agents, users), so that every kind of user has a way in from the start.
 */
async function createPeople(tx: AccountChanges) {
  if ((await tx.countUsers()) > 0) return undefined;
  const person = async (name: string, roles: Role[]) => {
    const password = randomBytes(12).toString('base64url');
    const user = await tx.createUser({ name, roles, password });
    await tx.audit({
      kind: 'user.created',
      actor: FIRST_RUN,
      details: { user: user.name, roles: user.roles },
    });
    return { name: user.name, password };
  };
  return { chair: await person('chair', ['chair']), admin: await person('admin', ['admin', 'compliance']) };
}

/**
 * New credentials for what the first run created, through the same audited commands an operator runs
 * (`agent rotate`, `user reset-password`), with actor `first-run`.
 */
async function renew(deps: FirstRunDeps, state: FirstRunState): Promise<FirstRun | undefined> {
  const next = { ...state, generation: state.generation + 1 };
  // Claimed first: an instance that starts at the same moment sees the claim and renews nothing.
  if (!(await deps.settings.replace(SETTING, state, next))) return undefined;
  let token: string;
  try {
    ({ token } = await runAdminCommand(deps, {
      command: 'agent.rotate',
      name: state.agent,
      actor: FIRST_RUN,
    }));
  } catch (err) {
    if (!isAppError(err, 'NOT_FOUND')) throw err;
    // The operator revoked the demo agent: they have moved on; there is nothing left to show.
    await deps.settings.replace(SETTING, next, { ...next, shown: true });
    return undefined;
  }
  const reset = async (name: string | null | undefined) => {
    if (!name) return undefined;
    const password = randomBytes(12).toString('base64url');
    try {
      await runAdminCommand(deps, { command: 'user.reset_password', name, password, actor: FIRST_RUN });
      return { name, password };
    } catch (err) {
      if (!isAppError(err, 'NOT_FOUND')) throw err; // disabled meanwhile: shown without it
      return undefined;
    }
  };
  const chair = await reset(state.chair);
  const adminUser = await reset(state.admin);
  return { token, chair, admin: adminUser, renewed: true, markShown: marker(deps.settings, next) };
}
