import fs from 'node:fs';
import path from 'node:path';
import type { Knex } from 'knex';
import { z } from 'zod';
import type { BlobStore } from '../connectors/local/blobs.ts';
import { demoData } from '../connectors/local/demo.ts';
import { importData, parseImportFile } from '../connectors/local/import.ts';
import { migrateLatest } from '../db/migrations.ts';
import { createApprovals } from '../approval/index.ts';
import { ApprovalStatus } from '../approval/view.ts';
import { DecisionError } from '../approval/decide.ts';
import { checkpointDeps, verifyDatabase } from '../audit/context.ts';
import { ChainBrokenError } from '../audit/checkpoints.ts';
import { ExportFilter, exportAudit, NothingToExportError } from '../audit/export.ts';
import { createAuditLog } from '../audit/log.ts';
import { publicBaseUrl, type Config } from '../config.ts';
import { createAgent, listAgents, revokeAgent, updateAgent } from '../accounts/agents.ts';
import { AgentName } from '../core/identity.ts';
import { loadProfiles } from '../server/profiles.ts';
import { checkCredentials, createUser } from '../accounts/users.ts';
import { Role, UserName, type User } from '../core/identity.ts';

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
  }),
  z.strictObject({
    command: z.literal('agent.set'),
    name: z.string().min(1),
    profile: z.string().min(1).optional(),
    rate_limit_per_min: z.number().int().positive().nullable().optional(),
  }),
  z.strictObject({ command: z.literal('agent.list') }),
  z.strictObject({ command: z.literal('agent.revoke'), name: z.string().min(1) }),
  z.strictObject({
    command: z.literal('user.add'),
    name: UserName,
    roles: z.array(Role).min(1),
    password: z.string().min(8, 'at least 8 characters'),
  }),
  z.strictObject({
    command: z.literal('approvals.list'),
    as: z.string().min(1),
    password: z.string(),
    status: z.string().optional(),
  }),
  z.strictObject({
    command: z.literal('audit.export'),
    format: z.enum(['jsonl', 'csv']),
    filter: ExportFilter.omit({ agent_id: true }),
    agent: z.string().min(1).optional(),
    path: z.string().min(1),
    actor: z.string().min(1),
  }),
  z.strictObject({ command: z.literal('audit.verify_db') }),
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
]);
export type AdminCommand = z.infer<typeof AdminCommand>;

/** `path: message; …` — the same wording whether a command ran here or inside the server. */
export function describeZodError(err: z.ZodError): string {
  return err.issues.map((i) => `${i.path.join('.') || 'input'}: ${i.message}`).join('; ');
}

export class AdminCommandError extends Error {
  override name = 'AdminCommandError';
}

export interface AdminDeps {
  knex: Knex;
  blobs: BlobStore;
  config: Config;
}

/** A profile named for an agent must be installed (profiles/NAME.json). */
function checkProfile(name: string | undefined, dir?: string): void {
  if (name === undefined) return;
  const installed = loadProfiles(dir);
  if (!installed.has(name)) {
    throw new AdminCommandError(`no profile "${name}" (installed: ${[...installed.keys()].join(', ')})`);
  }
}

async function signIn(deps: AdminDeps, name: string, password: string): Promise<User> {
  const user = await checkCredentials(deps.knex, name, password);
  if (!user) throw new AdminCommandError(`wrong user name or password for "${name}"`);
  return user;
}

function approvalsOf(deps: AdminDeps) {
  const audit = createAuditLog(deps.knex);
  return createApprovals({
    knex: deps.knex,
    audit,
    config: deps.config,
    reviewUrl: (id) => new URL(`/approvals/${id}`, publicBaseUrl(deps.config)).href,
  });
}

export async function runAdminCommand(deps: AdminDeps, input: unknown): Promise<Record<string, unknown>> {
  const cmd = AdminCommand.parse(input);
  switch (cmd.command) {
    case 'migrate':
      return { applied: await migrateLatest(deps.knex) };
    case 'demo':
      return { imported: await importData(deps.knex, deps.blobs, demoData()) };
    case 'import': {
      let data: unknown;
      try {
        data = parseImportFile(cmd.file_name, cmd.text);
      } catch (err) {
        throw new AdminCommandError(`${cmd.file_name}: ${(err as Error).message}`);
      }
      return { imported: await importData(deps.knex, deps.blobs, data) };
    }
    case 'agent.add': {
      checkProfile(cmd.profile, deps.config.policy.profiles_dir);
      const { agent, token } = await createAgent(deps.knex, cmd);
      return { agent, token };
    }
    case 'agent.set': {
      checkProfile(cmd.profile, deps.config.policy.profiles_dir);
      const { command: _c, name, ...change } = cmd;
      if (!(await updateAgent(deps.knex, name, change)))
        throw new AdminCommandError(`no agent named "${name}"`);
      return { updated: name, ...change };
    }
    case 'agent.list':
      return { agents: await listAgents(deps.knex) };
    case 'agent.revoke':
      if (!(await revokeAgent(deps.knex, cmd.name))) {
        throw new AdminCommandError(`no active agent named "${cmd.name}"`);
      }
      return { revoked: cmd.name };
    case 'audit.export':
      return exportToFile(deps, cmd);
    case 'audit.verify_db': {
      const result = await verifyDatabase(deps.knex);
      return { ok: result.ok, summary: result.summary };
    }
    case 'user.add':
      return { user: await createUser(deps.knex, cmd) };
    case 'approvals.list': {
      await signIn(deps, cmd.as, cmd.password);
      return {
        approvals: await approvalsOf(deps).listForReview({
          status: ApprovalStatus.parse(cmd.status ?? 'pending'),
        }),
      };
    }
    case 'approvals.show': {
      await signIn(deps, cmd.as, cmd.password);
      const shown = await approvalsOf(deps).showForReview(cmd.id);
      if (!shown) throw new AdminCommandError(`no approval request ${cmd.id}`);
      return { approval: shown };
    }
    case 'approvals.decide': {
      const user = await signIn(deps, cmd.as, cmd.password);
      try {
        return {
          approval: await approvalsOf(deps).decide({
            id: cmd.id,
            user,
            decision: cmd.decision,
            note: cmd.note,
          }),
        };
      } catch (err) {
        if (err instanceof DecisionError) throw new AdminCommandError(`${err.reason}: ${err.message}`);
        throw err;
      }
    }
    default:
      return cmd satisfies never;
  }
}

/** Writes an export and its manifest (FILE.manifest.json) where the operator asked. */
async function exportToFile(deps: AdminDeps, cmd: Extract<AdminCommand, { command: 'audit.export' }>) {
  let agentId: string | undefined;
  if (cmd.agent) {
    const row = (await deps.knex('agents').where({ name: cmd.agent }).first()) as { id: string } | undefined;
    if (!row) throw new AdminCommandError(`no agent named "${cmd.agent}"`);
    agentId = row.id;
  }
  const out = fs.createWriteStream(cmd.path, { flags: 'w', mode: 0o600 });
  try {
    const manifest = await exportAudit(
      await checkpointDeps(deps.knex, createAuditLog(deps.knex), deps.config),
      {
        format: cmd.format,
        filter: { ...cmd.filter, ...(agentId ? { agent_id: agentId } : {}) },
        out,
        file: path.basename(cmd.path),
        actor: cmd.actor,
      },
    );
    await new Promise<void>((resolve, reject) =>
      out.end((err?: Error | null) => (err ? reject(err) : resolve())),
    );
    const manifestPath = `${cmd.path}.manifest.json`;
    fs.writeFileSync(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o600 });
    return {
      path: cmd.path,
      manifest_path: manifestPath,
      row_count: manifest.row_count,
      checkpoint_seq: manifest.checkpoint.seq,
    };
  } catch (err) {
    out.destroy();
    fs.rmSync(cmd.path, { force: true });
    if (err instanceof NothingToExportError || err instanceof ChainBrokenError)
      throw new AdminCommandError(err.message);
    throw err;
  }
}
