import os from 'node:os';
import { z } from 'zod';
import { demoData, parseImportFile, type DirectoryImport, type PinAdmin } from '../connectors/index.ts';
import { compilePolicy, describeRequirement, isDecisionRefusal, type Approvals } from '../approval/index.ts';
import { unsatisfiableRules } from './policy-warnings.ts';
import { ApprovalStatus } from '../core/schemas.ts';
import { ExportFilter, describeAnchors, type AuditChecks } from '../audit/index.ts';
import type { Config } from '../config.ts';
import type { Settings } from '../db/settings.ts';
import type { AccountAdmin, AccountChanges, SignIn, UserChange } from '../accounts/index.ts';
import { loadProfiles } from '../core/profiles.ts';
import { AppError } from '../core/errors.ts';
import { AgentName, Role, UserName, type Agent, type User } from '../core/identity.ts';
import { acceptPins, listPins } from './upstreams.ts';

/**
 * The data-changing operator commands. They run in the CLI's own process when it can open the database,
 * or inside the running server (through its loopback admin endpoint) when the server holds the embedded
 * database — the same code and the same validation either way.
 */
export const AdminCommand = z.discriminatedUnion('command', [
  z.strictObject({ command: z.literal('migrate') }),
  z.strictObject({ command: z.literal('demo') }),
  z.strictObject({ command: z.literal('import'), file_name: z.string().min(1), text: z.string() }),
  z.strictObject({
    command: z.literal('agent.add'),
    name: AgentName,
    profile: z.string().min(1).optional(),
    owner: z.string().min(1).optional(),
    rate_limit_per_min: z.number().int().positive().optional(),
    actor: z.string().min(1),
  }),
  z.strictObject({
    command: z.literal('agent.set'),
    name: z.string().min(1),
    profile: z.string().min(1).optional(),
    rate_limit_per_min: z.number().int().positive().nullable().optional(),
    /** An existing user's name; null: no owner. */
    owner: z.string().min(1).nullable().optional(),
    actor: z.string().min(1),
  }),
  z.strictObject({ command: z.literal('agent.list') }),
  z.strictObject({ command: z.literal('agent.revoke'), name: z.string().min(1), actor: z.string().min(1) }),
  z.strictObject({ command: z.literal('agent.rotate'), name: z.string().min(1), actor: z.string().min(1) }),
  z.strictObject({
    command: z.literal('user.add'),
    name: UserName,
    roles: z.array(Role).min(1),
    password: z.string().min(8, 'at least 8 characters'),
    actor: z.string().min(1),
  }),
  z.strictObject({ command: z.literal('user.list') }),
  z.strictObject({
    command: z.literal('user.set'),
    name: z.string().min(1),
    roles: z.array(Role).min(1),
    actor: z.string().min(1),
  }),
  z.strictObject({
    command: z.literal('user.set_teams'),
    name: z.string().min(1),
    /** Replaces every team the user was in; empty leaves none. */
    teams: z.array(z.string()),
    actor: z.string().min(1),
  }),
  z.strictObject({
    command: z.literal('user.set_email'),
    name: z.string().min(1),
    /** null clears it. */
    email: z.email().nullable(),
    actor: z.string().min(1),
  }),
  z.strictObject({
    command: z.literal('user.reset_password'),
    name: z.string().min(1),
    password: z.string().min(8, 'at least 8 characters'),
    actor: z.string().min(1),
  }),
  z.strictObject({ command: z.literal('user.disable'), name: z.string().min(1), actor: z.string().min(1) }),
  /** Seals a user's record as it now stands (docs/identity.md, "Sealed records"); the operator's word. */
  z.strictObject({ command: z.literal('user.reseal'), name: z.string().min(1), actor: z.string().min(1) }),
  z.strictObject({ command: z.literal('agent.reseal'), name: z.string().min(1), actor: z.string().min(1) }),
  z.strictObject({
    command: z.literal('user.link'),
    name: z.string().min(1),
    /** Omitted: the configured provider's (web.oidc.issuer). */
    issuer: z.url().optional(),
    subject: z.string().min(1),
    actor: z.string().min(1),
  }),
  z.strictObject({
    command: z.literal('approvals.list'),
    as: z.string().min(1),
    password: z.string(),
    status: z.string().optional(),
    /** Only what this chair can decide now (pending, undecided by them, a rule they are among). */
    waiting_for_me: z.boolean().optional(),
  }),
  z.strictObject({ command: z.literal('policy.show') }),
  z.strictObject({
    command: z.literal('policy.set'),
    /** The policy document, as `countersign policy check` reads it. */
    policy: z.unknown(),
    actor: z.string().min(1),
  }),
  z.strictObject({
    /** The rules of a policy no request could get through as the users stand now; nothing stored. */
    command: z.literal('policy.warnings'),
    policy: z.unknown(),
  }),
  z.strictObject({
    command: z.literal('policy.explain'),
    /** The tool as agents call it, with or without the configured prefix. */
    tool: z.string().min(1),
    args: z.record(z.string(), z.unknown()),
    agent: z.string().min(1).optional(),
    /** A policy document to explain instead of the one in force (a file not yet applied). */
    policy: z.unknown().optional(),
  }),
  z.strictObject({
    command: z.literal('audit.export'),
    format: z.enum(['jsonl', 'csv']),
    filter: ExportFilter.omit({ agent_id: true }),
    agent: z.string().min(1).optional(),
    path: z.string().min(1),
    actor: z.string().min(1),
  }),
  z.strictObject({
    command: z.literal('audit.accept_restore'),
    /** Why the log is taken back to the restored head: kept in the audited row. */
    reason: z.string().trim().min(1),
    actor: z.string().min(1),
  }),
  z.strictObject({
    command: z.literal('audit.verify_db'),
    /** Check the stored time-stamp tokens against this certificate (PEM text). */
    tsa_cert: z.string().min(1).optional(),
    /** Check the chain against the heads of this witness directory (an absolute path). */
    witness_dir: z.string().min(1).optional(),
    /** The public keys (PEM) the checkpoints may be signed with; default the one the cluster records. */
    pubkeys: z.array(z.string().min(1)).optional(),
  }),
  z.strictObject({
    command: z.literal('approvals.show'),
    as: z.string().min(1),
    password: z.string(),
    id: z.string(),
  }),
  z.strictObject({
    command: z.literal('approvals.decide'),
    as: z.string().min(1),
    password: z.string(),
    id: z.string(),
    decision: z.enum(['approve', 'reject']),
    note: z.string().optional(),
  }),
  z.strictObject({ command: z.literal('upstream.list'), name: z.string().min(1).optional() }),
  z.strictObject({
    command: z.literal('upstream.accept'),
    name: z.string().min(1),
    tool: z.string().min(1).optional(),
    actor: z.string().min(1),
  }),
]);
export type AdminCommand = z.infer<typeof AdminCommand>;

/** `path: message; …` — the same wording whether a command ran here or inside the server. */
export function describeZodError(err: z.ZodError): string {
  return err.issues.map((i) => `${i.path.join('.') || 'input'}: ${i.message}`).join('; ');
}

/**
 * The stores the commands work through (built by the composition root, app/admin-deps.ts): no command
 * sees the database itself.
 */
export interface AdminDeps {
  config: Config;
  /** Applies the migrations not yet applied; the names of those it applied. */
  migrate: () => Promise<string[]>;
  accounts: AccountAdmin;
  signIn: SignIn;
  approvals: Approvals;
  directory: DirectoryImport;
  auditChecks: AuditChecks;
  pins: PinAdmin;
  settings: Settings;
  /**
   * Told, once its change has committed, of every agent a command changed (an `agent.*` audit row names
   * it: token, profile, rate limit, revocation), so that the replica running the command stops trusting
   * what it cached of the agent at once rather than when PostgreSQL's notification comes back.
   */
  agentChanged?: (agentId: string) => void;
  /**
   * Lists the upstreams again once an accepted pin has committed, so that the server running the command
   * applies it before answering (other replicas hear of it through PostgreSQL).
   */
  upstreamsChanged?: () => Promise<void>;
}

/** A profile named for an agent must be installed (profiles/NAME.json). */
function checkProfile(name: string | undefined, dir?: string): void {
  if (name === undefined) return;
  const installed = loadProfiles(dir);
  if (!installed.has(name)) {
    throw new AppError('NOT_FOUND', `no profile "${name}" (installed: ${[...installed.keys()].join(', ')})`);
  }
}

/**
 * `--as USER`: the same sign-in as the web form's, with the same limits and the same user.login_failed
 * rows; the origin is this host's command line, so failures there lock it out as one client address.
 */
async function signInAs(deps: AdminDeps, name: string, password: string): Promise<User> {
  const outcome = await deps.signIn.signIn({ name, password, origin: `cli@${os.hostname()}`, via: 'cli' });
  if (!('refused' in outcome)) return outcome.user;
  if (outcome.refused === 'locked_out') {
    throw new AppError(
      'NOT_LOGGED_IN',
      `too many failed sign-ins for "${name}" (or from this host): wait 15 minutes, then try again`,
      'locked_out',
    );
  }
  throw new AppError('NOT_LOGGED_IN', `wrong user name or password for "${name}"`, 'wrong_password');
}

type Command<K extends AdminCommand['command']> = Extract<AdminCommand, { command: K }>;

/** Which approval rule a call would meet and what it would ask, nothing drafted (policy explain). */
async function explainCommand(deps: AdminDeps, cmd: Command<'policy.explain'>) {
  const prefix = deps.config.tools.prefix;
  const tool = cmd.tool.startsWith(prefix) ? cmd.tool.slice(prefix.length) : cmd.tool;
  const record = cmd.agent ? await deps.accounts.activeAgentNamed(cmd.agent) : undefined;
  if (cmd.agent && !record) throw noActiveAgent(cmd.agent);
  const policy =
    cmd.policy === undefined ? undefined : compilePolicy(cmd.policy, deps.config.approval.required_approvers);
  const decision = await deps.approvals.explain(tool, cmd.args, record, policy);
  return { tool, ...decision, asks: describeRequirement(decision.requirement) };
}

/** A chair's decision; a refusal keeps its reason, in its message too (the CLI prints that). */
async function decideCommand(deps: AdminDeps, cmd: Command<'approvals.decide'>) {
  const user = await signInAs(deps, cmd.as, cmd.password);
  try {
    const { id, decision, note } = cmd;
    return { approval: await deps.approvals.decide({ id, user, decision, note }) };
  } catch (err) {
    if (isDecisionRefusal(err))
      throw new AppError(err.code, `${err.reason}: ${err.message}`, err.reason, { cause: err });
    throw err;
  }
}

/** What an agent.created row says of the agent (its owner by name and id): never its token. */
const agentFacts = (agent: Agent, owner: string | null) => ({
  agent: agent.name,
  agent_name: agent.name,
  profile: agent.profile,
  owner,
  ...(agent.owner_id ? { owner_id: agent.owner_id } : {}),
  rate_limit_per_min: agent.rate_limit_per_min,
});

/** Runs a data-changing command and appends its audit rows in the same transaction: both or neither. */
async function audited<T>(deps: AdminDeps, work: (tx: AccountChanges) => Promise<T>): Promise<T> {
  const agents = new Set<string>();
  const result = await deps.accounts.change((tx) =>
    work({
      ...tx,
      audit: (row) => {
        if (row.kind.startsWith('agent.') && row.agent_id) agents.add(row.agent_id);
        return tx.audit(row);
      },
    }),
  );
  // Committed: every agent an audit row says changed is dropped from this replica's cache now.
  for (const id of agents) deps.agentChanged?.(id);
  return result;
}

/** A change to a user and its audit row (what changed, never a secret), committed together. */
async function userCommand(
  deps: AdminDeps,
  cmd: { name: string; actor: string },
  kind: 'user.role_changed' | 'user.password_reset' | 'user.disabled',
  change: UserChange,
) {
  return audited(deps, async (tx) => {
    const { before, after } = await tx.changeUser(cmd.name, change);
    await tx.audit({
      kind,
      actor: cmd.actor,
      details: { user: cmd.name, ...('roles' in change ? { roles_before: before, roles_after: after } : {}) },
    });
    return { user: cmd.name, roles: after };
  });
}

/**
 * agent.owner_changed, unless the owner stays who it was: the owners before and after by name and id (an
 * unresolved owner name as it was written).
 */
async function ownerChanged(
  tx: AccountChanges,
  change: {
    actor: string;
    before: Agent & { owner_unresolved: string | null };
    after: { id: string; name: string } | null;
  },
) {
  const { before, after } = change;
  if (before.owner_unresolved === null && before.owner_id === (after?.id ?? null)) return;
  const was = before.owner_id ? await tx.userNameOf(before.owner_id) : undefined;
  await tx.audit({
    kind: 'agent.owner_changed',
    actor: change.actor,
    agent_id: before.id,
    details: {
      agent: before.name,
      agent_name: before.name,
      before: was ?? null,
      before_id: before.owner_id,
      ...(before.owner_unresolved === null ? {} : { before_unresolved: before.owner_unresolved }),
      after: after?.name ?? null,
      after_id: after?.id ?? null,
    },
  });
}

/** Links a person's single sign-on identity to an existing user, audited (user.linked). */
async function linkCommand(deps: AdminDeps, cmd: Command<'user.link'>) {
  const issuer = cmd.issuer ?? deps.config.web.oidc?.issuer;
  if (!issuer) {
    throw new AppError(
      'CONFIG_INVALID',
      'give --issuer: single sign-on (web.oidc) is not configured here',
      'no_issuer',
    );
  }
  return audited(deps, async (tx) => {
    const linked = await tx.linkIdentity(cmd.name, { issuer, subject: cmd.subject });
    if (linked.unchanged) return { user: linked.user, issuer, subject: cmd.subject, unchanged: true };
    await tx.audit({
      kind: 'user.linked',
      actor: cmd.actor,
      details: {
        user: linked.user,
        issuer,
        subject: cmd.subject,
        via: 'cli',
        ...(linked.before ? { replaced: linked.before } : {}),
      },
    });
    return { user: linked.user, issuer, subject: cmd.subject, unchanged: false };
  });
}

/** The refusal of a command naming an agent that does not exist or is revoked. */
const noActiveAgent = (name: string) =>
  new AppError('NOT_FOUND', `no active agent named "${name}"`, 'unknown_agent');

/** A new token for an agent; the change and its audit row commit together. */
async function rotateCommand(deps: AdminDeps, cmd: Command<'agent.rotate'>) {
  return audited(deps, async (tx) => {
    const rotated = await tx.rotateAgentToken(cmd.name);
    if (!rotated) throw noActiveAgent(cmd.name);
    await tx.audit({
      kind: 'agent.token_rotated',
      actor: cmd.actor,
      agent_id: rotated.agent_id,
      details: { agent: cmd.name, agent_name: cmd.name },
    });
    return { token: rotated.token };
  });
}

/** Writes an export and its manifest (FILE.manifest.json) where the operator asked. */
async function exportCommand(deps: AdminDeps, cmd: Command<'audit.export'>) {
  const { path, manifest_path, manifest } = await deps.auditChecks.exportToFile({
    format: cmd.format,
    filter: { ...cmd.filter, agent: cmd.agent },
    path: cmd.path,
    actor: cmd.actor,
  });
  return { path, manifest_path, row_count: manifest.row_count, checkpoint_seq: manifest.checkpoint.seq };
}

/** One handler per command; what each returns is the command's result, in this process or through the server. */
const HANDLERS = {
  migrate: async (deps) => ({ applied: await deps.migrate() }),
  demo: async (deps) => ({ imported: await deps.directory.load(demoData()) }),
  import: async (deps, cmd) => {
    let data: unknown;
    try {
      data = parseImportFile(cmd.file_name, cmd.text);
    } catch (err) {
      throw new AppError('CONFIG_INVALID', `${cmd.file_name}: ${(err as Error).message}`, undefined, {
        cause: err,
      });
    }
    return { imported: await deps.directory.load(data) };
  },
  'agent.add': async (deps, cmd) => {
    checkProfile(cmd.profile, deps.config.policy.profiles_dir);
    const { command: _c, actor, ...opts } = cmd;
    return audited(deps, async (tx) => {
      const { agent, token, owner } = await tx.createAgent(opts);
      await tx.audit({ kind: 'agent.created', actor, agent_id: agent.id, details: agentFacts(agent, owner) });
      return { agent, token };
    });
  },
  'agent.set': async (deps, cmd) => {
    checkProfile(cmd.profile, deps.config.policy.profiles_dir);
    const { command: _c, actor, name, owner, ...change } = cmd;
    return audited(deps, async (tx) => {
      const before = await tx.agentNamedForUpdate(name);
      if (!before) throw new AppError('NOT_FOUND', `no agent named "${name}"`, 'unknown_agent');
      // undefined: the owner stays; null: no owner from now on.
      const newOwner = typeof owner === 'string' ? await tx.ownerNamed(owner) : owner;
      await tx.updateAgent(name, { ...change, owner_id: newOwner && newOwner.id });
      if (newOwner !== undefined) await ownerChanged(tx, { actor, before, after: newOwner });
      for (const field of ['profile', 'rate_limit_per_min'] as const) {
        if (change[field] === undefined || change[field] === before[field]) continue;
        await tx.audit({
          kind: field === 'profile' ? 'agent.profile_changed' : 'agent.rate_limit_changed',
          actor,
          agent_id: before.id,
          details: { agent: name, agent_name: name, before: before[field], after: change[field] },
        });
      }
      return {
        updated: name,
        ...change,
        ...(newOwner === undefined ? {} : { owner: newOwner?.name ?? null }),
      };
    });
  },
  'agent.list': async (deps) => ({ agents: await deps.accounts.listAgents() }),
  'agent.revoke': async (deps, cmd) =>
    audited(deps, async (tx) => {
      const agent = await tx.activeAgentNamed(cmd.name);
      if (!agent || !(await tx.revokeAgent(cmd.name))) throw noActiveAgent(cmd.name);
      await tx.audit({
        kind: 'agent.revoked',
        actor: cmd.actor,
        agent_id: agent.id,
        details: { agent: cmd.name, agent_name: agent.name },
      });
      return { revoked: cmd.name };
    }),
  'agent.rotate': rotateCommand,
  'agent.reseal': (deps, cmd) =>
    audited(deps, async (tx) => {
      const { sealed, was_sealed, id } = await tx.resealAgent(cmd.name);
      await tx.audit({
        kind: 'agent.resealed',
        actor: cmd.actor,
        agent_id: id,
        details: { agent: cmd.name, agent_name: cmd.name, was_sealed, sealed },
      });
      return { agent: cmd.name, was_sealed, sealed };
    }),
  'user.reseal': (deps, cmd) =>
    audited(deps, async (tx) => {
      const { sealed, was_sealed } = await tx.resealUser(cmd.name);
      await tx.audit({
        kind: 'user.resealed',
        actor: cmd.actor,
        details: { user: cmd.name, was_sealed, sealed },
      });
      return { user: cmd.name, was_sealed, sealed };
    }),
  'audit.export': exportCommand,
  'audit.accept_restore': (deps, cmd) => deps.auditChecks.acceptRestore(cmd.reason, cmd.actor),
  'audit.verify_db': async (deps, cmd) => {
    const { ok, summary, tail, key_source } = await deps.auditChecks.verify(cmd.pubkeys);
    if (cmd.tsa_cert === undefined && cmd.witness_dir === undefined)
      return { ok, summary, tail: tail ?? null, key_source };
    const anchors = await deps.auditChecks.verifyAnchors({
      tsaCertPem: cmd.tsa_cert,
      witnessDir: cmd.witness_dir,
      tsaMaxSkewS: deps.config.audit.anchors.tsa_max_skew_s,
    });
    const both = `${summary}\n${describeAnchors(anchors)}`;
    return { ok: ok && anchors.ok, summary: both, tail: tail ?? null, key_source };
  },
  'user.add': async (deps, cmd) => {
    const { command: _c, actor, ...opts } = cmd;
    return audited(deps, async (tx) => {
      const user = await tx.createUser(opts);
      await tx.audit({ kind: 'user.created', actor, details: { user: user.name, roles: user.roles } });
      return { user };
    });
  },
  'user.list': async (deps) => ({ users: await deps.accounts.listUsers() }),
  'user.set': (deps, cmd) => userCommand(deps, cmd, 'user.role_changed', { roles: cmd.roles }),
  'user.set_email': (deps, cmd) =>
    audited(deps, async (tx) => {
      const { before, after } = await tx.setUserEmail(cmd.name, cmd.email);
      const details = { user: cmd.name, email_before: before, email_after: after };
      await tx.audit({ kind: 'user.email_changed', actor: cmd.actor, details });
      return { user: cmd.name, email: after };
    }),
  'user.set_teams': (deps, cmd) =>
    audited(deps, async (tx) => {
      const { before, after } = await tx.setUserTeams(cmd.name, cmd.teams);
      const details = { user: cmd.name, teams_before: before, teams_after: after };
      await tx.audit({ kind: 'user.teams_changed', actor: cmd.actor, details });
      return { user: cmd.name, teams: after };
    }),
  'user.reset_password': (deps, cmd) =>
    userCommand(deps, cmd, 'user.password_reset', { password: cmd.password }),
  'user.disable': (deps, cmd) => userCommand(deps, cmd, 'user.disabled', { disable: true }),
  'user.link': linkCommand,
  'approvals.list': async (deps, cmd) => {
    const user = await signInAs(deps, cmd.as, cmd.password);
    const status = ApprovalStatus.parse(cmd.status ?? 'pending');
    const waiting_for = cmd.waiting_for_me ? { id: user.id, name: user.name } : undefined;
    return { approvals: await deps.approvals.listForReview({ status, waiting_for }) };
  },
  'policy.show': async (deps) => {
    const { policy } = deps.approvals;
    const current = await policy.fresh();
    return {
      version: current.version,
      origin: await policy.origin(),
      // TAMPERED: the stored policy does not carry its seal and is not applied (docs/policy.md).
      status: current.tampered ? ('TAMPERED' as const) : ('sealed' as const),
      policy: current.doc,
    };
  },
  'policy.set': async (deps, cmd) => {
    const stored = await deps.approvals.policy.set(cmd.policy, cmd.actor);
    return { ...stored, warnings: unsatisfiableRules(cmd.policy, await deps.accounts.listUsers()) };
  },
  'policy.warnings': async (deps, cmd) => ({
    warnings: unsatisfiableRules(cmd.policy, await deps.accounts.listUsers()),
  }),
  'policy.explain': explainCommand,
  'approvals.show': async (deps, cmd) => {
    const user = await signInAs(deps, cmd.as, cmd.password);
    const shown = await deps.approvals.showForReview(cmd.id, user.name);
    if (!shown) throw new AppError('NOT_FOUND', `no approval request ${cmd.id}`);
    return { approval: shown };
  },
  'approvals.decide': decideCommand,
  'upstream.list': async (deps, cmd) => ({ pins: await listPins(deps.pins, deps.config, cmd.name) }),
  'upstream.accept': (deps, cmd) =>
    acceptPins(
      { pins: deps.pins, refresh: deps.upstreamsChanged },
      { upstream: cmd.name, tool: cmd.tool, actor: cmd.actor },
    ),
} satisfies { [K in AdminCommand['command']]: (deps: AdminDeps, cmd: Command<K>) => Promise<object> };

/** What each command returns, by command name. */
export type AdminResults = { [K in AdminCommand['command']]: Awaited<ReturnType<(typeof HANDLERS)[K]>> };
/** What a command returns: its type follows from the command's. */
export type AdminResult<C extends AdminCommand = AdminCommand> = AdminResults[C['command']];

/** Validates `input` as a command (it may come over the wire) and runs it. */
export async function runAdminCommand<C extends AdminCommand>(
  deps: AdminDeps,
  input: C,
): Promise<AdminResult<C>>;
export async function runAdminCommand(deps: AdminDeps, input: unknown): Promise<AdminResult>;
export async function runAdminCommand(deps: AdminDeps, input: unknown): Promise<AdminResult> {
  const cmd = AdminCommand.parse(input);
  // The union of handlers cannot be called with the union of commands; HANDLERS pairs them by name.
  const handler = HANDLERS[cmd.command] as (deps: AdminDeps, cmd: AdminCommand) => Promise<AdminResult>;
  return handler(deps, cmd);
}
