import { Command, CommanderError } from 'commander';
import { z } from 'zod';
import { describePgError } from './admin/pg-errors.ts';
import { addAgentCommands } from './cli/agents.ts';
import { addApprovalCommands } from './cli/approvals.ts';
import { addAuditCommands } from './cli/audit.ts';
import { errFlushed, USAGE } from './cli/io.ts';
import { addPolicyCommands } from './cli/policy.ts';
import { addServeCommand } from './cli/serve.ts';
import { addDbCommands, addStoreCommands } from './cli/store.ts';
import { addUpstreamCommands } from './cli/upstreams.ts';
import { addUserCommands } from './cli/users.ts';
import { isAppError } from './core/errors.ts';
import { sourceStack } from './core/stack.ts';
import { VERSION } from './core/version.ts';

/**
 * The command line: a list of the commands each part of the program offers (src/cli/), and how a
 * command's failure becomes a line on stderr and an exit code. src/cli/ is the only part of the
 * program that reads process.env and argv and writes to the terminal.
 *
 * Each command imports what it needs when it runs: a start-up, or a one-off command, then loads only
 * its own part of the program (the HTTP server and the embedded database are the heavy ones).
 */

/** The commands, in the order `countersign --help` lists them. */
const COMMANDS: ((cli: Command) => void)[] = [
  addServeCommand,
  addStoreCommands,
  addDbCommands,
  addAgentCommands,
  addAuditCommands,
  addUserCommands,
  addApprovalCommands,
  addPolicyCommands,
  addUpstreamCommands,
];

/**
 * `serve` is the default command, so commander would hand an unknown word to it as an argument
 * ("too many arguments for 'serve'"): a first operand that names no command is refused here instead.
 */
function refuseUnknownCommand(cli: Command, argv: string[]): void {
  const first = argv.slice(2).find((a) => !a.startsWith('-'));
  const names = cli.commands.map((c) => c.name());
  if (first === undefined || first === 'help' || names.includes(first)) return;
  cli.error(`error: unknown command '${first}' (commands: ${names.join(', ')})`, {
    code: 'commander.unknownCommand',
  });
}

function program(): Command {
  const cli = new Command('countersign')
    .description('MCP server: reads run freely, writes need a human approval bound to the exact content')
    .version(VERSION)
    .showHelpAfterError()
    // Usage errors are thrown, not exited on, so that the catch below can give them exit code 2.
    // Set before the subcommands are made: they inherit it.
    .exitOverride();
  for (const add of COMMANDS) add(cli);
  return cli;
}

async function explain(e: unknown): Promise<string> {
  if (isAppError(e, 'CONFIG_INVALID', 'config')) return `configuration error: ${e.message}`;
  if (e instanceof z.ZodError) return (await import('./admin/commands.ts')).describeZodError(e);
  if (isAppError(e, 'CONFIG_INVALID', 'profile')) return `profile error: ${e.message}`;
  if (isAppError(e)) return e.message;
  const pg = describePgError(e, process.env.DATABASE_URL);
  if (pg) return pg;
  if (e instanceof Error && 'code' in e && e.code === 'EADDRINUSE') return `cannot listen: ${e.message}`;
  return e instanceof Error ? (e.stack ? sourceStack(e.stack) : e.message) : String(e);
}

/** Exit codes: 0 done, 1 the command failed, 2 the command line was wrong (nothing was done). */
try {
  const cli = program();
  refuseUnknownCommand(cli, process.argv);
  await cli.parseAsync(process.argv);
  process.exitCode ??= 0;
} catch (e) {
  if (e instanceof CommanderError) {
    // commander has already printed its message (or the help or version asked for).
    process.exitCode = e.exitCode === 0 ? 0 : 2;
  } else {
    process.exitCode = isAppError(e, 'CONFIG_INVALID', USAGE) ? 2 : 1;
    // One line, then out: a failed command has nothing left to do, and whatever it opened (a pool still
    // waiting on a database that does not answer) must not keep the process alive after its answer.
    await errFlushed(`countersign: ${await explain(e)}\n`);
    process.exit();
  }
}
