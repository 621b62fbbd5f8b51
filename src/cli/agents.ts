import fs from 'node:fs';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { positiveInt, positiveIntOrDefault } from '../admin/cli-input.ts';
import type { Config } from '../config.ts';
import { AppError } from '../core/errors.ts';
import { cliActor, config, err, out, profile, tampered, usageError } from './io.ts';
import { addResealCommand } from './reseal.ts';
import { runData } from './run-data.ts';

/**
 * The agents' commands (docs/identity.md): their tokens, profiles, owners and limits, and Claude
 * Desktop's config block for a new one.
 */

/** `agent add`: the token alone on stdout, or a client's whole config block with it (`--config`). */
async function addAgent(
  name: string,
  opts: { profile: string; owner?: string; rateLimit?: number; config?: string },
): Promise<void> {
  const result = await runData(config(), {
    command: 'agent.add',
    actor: cliActor(),
    name,
    profile: opts.profile,
    owner: opts.owner,
    rate_limit_per_min: opts.rateLimit,
  });
  err(
    `agent "${result.agent.name}" created (id ${result.agent.id}); keep this token, it is not shown again:`,
  );
  if (opts.config !== 'claude-desktop') {
    out(result.token);
    return;
  }
  out(JSON.stringify(claudeDesktopConfig(config(), result.token), null, 2));
  err(
    `add the "countersign" entry under "mcpServers" in ${claudeDesktopConfigFile()}, ` +
      'then quit Claude Desktop fully and start it again',
  );
}

/**
 * The checkout this CLI belongs to: that of the bin/countersign.js it was started as (npx, a global
 * link), else the nearest directory above this module with one (npm start runs dist/cli.js).
 */
function packageRoot(): string {
  const started = process.argv[1] ? fs.realpathSync(process.argv[1]) : '';
  if (path.basename(started) === 'countersign.js' && path.basename(path.dirname(started)) === 'bin')
    return path.dirname(path.dirname(started));
  for (let dir = import.meta.dirname; ; dir = path.dirname(dir)) {
    if (fs.existsSync(path.join(dir, 'bin', 'countersign.js'))) return dir;
    if (path.dirname(dir) === dir)
      throw new AppError('NOT_FOUND', 'bin/countersign.js not found above the CLI');
  }
}

/**
 * Claude Desktop's `mcpServers` entry for an agent: node by its absolute path (Claude Desktop starts it
 * without the shell's PATH), this checkout's command, and the environment that points `serve --stdio`
 * at the same data (a running server on it is joined).
 */
function claudeDesktopConfig(cfg: Config, token: string) {
  const env: Record<string, string> = { COUNTERSIGN_AGENT_TOKEN: token, COUNTERSIGN_DATA_DIR: cfg.data_dir };
  if (process.env.COUNTERSIGN_CONFIG) env.COUNTERSIGN_CONFIG = path.resolve(process.env.COUNTERSIGN_CONFIG);
  if (cfg.database_url) env.DATABASE_URL = cfg.database_url;
  return {
    mcpServers: {
      countersign: {
        command: process.execPath,
        args: [path.join(packageRoot(), 'bin', 'countersign.js'), 'serve', '--stdio'],
        env,
      },
    },
  };
}

/** Where Claude Desktop keeps its config on this OS. */
function claudeDesktopConfigFile(): string {
  if (process.platform === 'darwin') return '~/Library/Application Support/Claude/claude_desktop_config.json';
  if (process.platform === 'win32') return '%APPDATA%\\Claude\\claude_desktop_config.json';
  return "Claude Desktop's claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/, Windows: %APPDATA%\\Claude\\)";
}

/** `agent add|set|list|rotate|revoke|reseal`. */
export function addAgentCommands(cli: Command): void {
  const agent = cli.command('agent').description('manage agents (MCP clients)');
  agent
    .command('add')
    .argument('<name>')
    .option('--profile <profile>', 'tool profile (an installed one)', profile, 'all')
    .option('--owner <user>', 'an existing user who owns this agent (may not decide its requests)')
    .option('--rate-limit <n>', 'calls per minute (default: policy.rate_limit_per_min)', positiveInt)
    .addOption(
      new Option(
        '--config <client>',
        "print the client's config block with the new token (JSON on stdout) instead of the token alone",
      ).choices(['claude-desktop']),
    )
    .description('create an agent; its token is printed once, alone on the last line')
    .action(addAgent);
  agent
    .command('set')
    .argument('<name>')
    .option('--profile <profile>', 'another tool profile (an installed one)', profile)
    .option('--rate-limit <n>', 'calls per minute, or "default"', positiveIntOrDefault)
    .option('--owner <user>', 'an existing user who owns this agent, or "none"')
    .description("change an agent's profile, rate limit or owner")
    .action(
      async (name: string, opts: { profile?: string; rateLimit?: number | 'default'; owner?: string }) => {
        if (opts.profile === undefined && opts.rateLimit === undefined && opts.owner === undefined)
          throw usageError('agent set: give --profile, --rate-limit or --owner');
        await runData(config(), {
          command: 'agent.set',
          actor: cliActor(),
          name,
          profile: opts.profile,
          rate_limit_per_min: opts.rateLimit === 'default' ? null : opts.rateLimit,
          owner: opts.owner === 'none' ? null : opts.owner,
        });
        out(`agent "${name}" updated`);
      },
    );
  agent
    .command('list')
    .description('list agents')
    .action(async () => {
      const { agents } = await runData(config(), { command: 'agent.list' });
      if (agents.length === 0) out('no agents');
      for (const a of agents) {
        const owner = a.owner ?? (a.owner_unresolved === null ? '-' : `${a.owner_unresolved}(names no user)`);
        out(
          `${a.name}\t${a.id}\tprofile=${a.profile}\towner=${owner}\t${a.revoked_at ? `revoked ${a.revoked_at}` : 'active'}${tampered(a)}`,
        );
      }
    });
  agent
    .command('rotate')
    .argument('<name>')
    .description(
      'give an agent a new token, printed once alone on the last line; the old one is refused at once',
    )
    .action(async (name: string) => {
      const result = await runData(config(), { command: 'agent.rotate', name, actor: cliActor() });
      err(
        `agent "${name}" has a new token; the old one is refused from now on. Keep this one, it is not shown again:`,
      );
      out(result.token);
    });
  agent
    .command('revoke')
    .argument('<name>')
    .description('revoke an agent: its token stops working at once')
    .action(async (name: string) => {
      await runData(config(), { command: 'agent.revoke', name, actor: cliActor() });
      out(`agent "${name}" revoked`);
    });
  addResealCommand(agent, 'agent', 'profile, limit, owner, token and revocation');
}
