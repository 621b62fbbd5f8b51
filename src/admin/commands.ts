import type { Knex } from 'knex';
import { z } from 'zod';
import type { BlobStore } from '../connectors/local/blobs.ts';
import { demoData } from '../connectors/local/demo.ts';
import { importData, parseImportFile } from '../connectors/local/import.ts';
import { migrateLatest } from '../db/migrations.ts';
import { AgentName, createAgent, listAgents, revokeAgent } from '../server/agents.ts';

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
  }),
  z.strictObject({ command: z.literal('agent.list') }),
  z.strictObject({ command: z.literal('agent.revoke'), name: z.string().min(1) }),
]);
export type AdminCommand = z.infer<typeof AdminCommand>;

export class AdminCommandError extends Error {
  override name = 'AdminCommandError';
}

export interface AdminDeps {
  knex: Knex;
  blobs: BlobStore;
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
      const { agent, token } = await createAgent(deps.knex, cmd);
      return { agent, token };
    }
    case 'agent.list':
      return { agents: await listAgents(deps.knex) };
    case 'agent.revoke':
      if (!(await revokeAgent(deps.knex, cmd.name))) {
        throw new AdminCommandError(`no active agent named "${cmd.name}"`);
      }
      return { revoked: cmd.name };
    default:
      return cmd satisfies never;
  }
}
