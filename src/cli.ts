import { createPrivateKey, createPublicKey } from 'node:crypto';
import fs from 'node:fs';
import { countHiddenIn, marked } from './core/visible.ts';
import os from 'node:os';
import path from 'node:path';
import { Command, CommanderError, Option } from 'commander';
import { z } from 'zod';
import {
  CHOICES,
  formatOfFile,
  installedProfile,
  isoTime,
  positiveInt,
  positiveIntOrDefault,
  roles,
} from './admin/cli-input.ts';
import type { AdminCommand, AdminDeps, AdminResult, AdminResults } from './admin/commands.ts';
import { describePgError, postgresProblem } from './admin/pg-errors.ts';
import { readHiddenLine } from './admin/secret.ts';
import type { FirstRun } from './admin/first-run.ts';
import type { StdioReady } from './app/serve-stdio.ts';
import type { JoinTarget } from './app/stdio-join.ts';
import type { Logger } from './log.ts';
import type { Manifest } from './audit/index.ts';
import { loadConfig, publicBaseUrl, type Config } from './config.ts';
import type { ImportSummary } from './connectors/index.ts';
import { AppError, isAppError } from './core/errors.ts';
import type { Role } from './core/identity.ts';
import { lockedBy, lockHolder } from './db/lock.ts';
import { VERSION } from './core/version.ts';
import { agentToolName } from './core/tool-names.ts';
import { sourceStack } from './core/stack.ts';

/**
 * The only module that reads process.env, argv and writes to the terminal.
 *
 * Each command imports what it needs when it runs: a start-up, or a one-off command, then loads only
 * its own part of the program (the HTTP server and the embedded database are the heavy ones).
 */

const out = (line: string) => process.stdout.write(`${line}\n`);
const err = (line: string) => process.stderr.write(`${line}\n`);
/** Who acts, in audit rows of commands run here: the OS user and the host. */
const cliActor = () => `cli:${os.userInfo().username}@${os.hostname()}`;

/** The reason of a command line that cannot be right whatever the data: exit code 2, like commander's. */
const USAGE = 'usage';
const usageError = (message: string) => new AppError('CONFIG_INVALID', message, USAGE);

/** Commands that need data already there: on a missing data directory they must not create one. */
const NEEDS_EXISTING = new Set<AdminCommand['command']>([
  'agent.list',
  'agent.set',
  'agent.rotate',
  'user.list',
  'user.set',
  'user.set_email',
  'user.set_teams',
  'user.reset_password',
  'user.disable',
  'user.reseal',
  'agent.reseal',
  'user.link',
  'agent.revoke',
  'audit.export',
  'audit.verify_db',
  'audit.accept_restore',
  'approvals.list',
  'approvals.show',
  'approvals.decide',
  'upstream.list',
  'upstream.accept',
  'policy.show',
  'policy.set',
  'policy.explain',
]);

/** Refuses, before anything is opened, an embedded database that is not there. */
function checkDataExists(cfg: Config, command: AdminCommand): void {
  if (cfg.database_url || !NEEDS_EXISTING.has(command.command) || fs.existsSync(cfg.pglite_dir)) return;
  const what = fs.existsSync(cfg.data_dir)
    ? `the data directory ${cfg.data_dir} holds no database (no ${cfg.pglite_dir})`
    : `the data directory ${cfg.data_dir} does not exist`;
  throw new AppError(
    'NOT_FOUND',
    `${what}; set COUNTERSIGN_DATA_DIR or run from the right directory. Nothing was created.`,
  );
}

function config(): Config {
  return loadConfig(process.env, process.cwd());
}

/** Sends a command to the server that holds the embedded database; its refusals come back as they are. */
async function runViaServer<C extends AdminCommand>(
  cfg: Config,
  command: C,
  holderPid: number,
): Promise<AdminResult<C>> {
  // Where the command ran is the user's concern only when debugging: its answer is the same.
  if (cfg.log_level === 'debug' || cfg.log_level === 'trace')
    err(
      `countersign: the running server (pid ${holderPid}) holds the embedded database; sending the command to it`,
    );
  const { sendAdminCommand, UNREACHABLE } = await import('./admin/endpoint-client.ts');
  try {
    return await sendAdminCommand(cfg.data_dir, command);
  } catch (e) {
    if (!isAppError(e, 'LOCKED', UNREACHABLE)) throw e;
    throw new AppError(
      'LOCKED',
      `the server (pid ${holderPid}) holds the database in ${cfg.pglite_dir}, and ${e.message}`,
      UNREACHABLE,
      { cause: e },
    );
  }
}

/**
 * Runs a data-changing command: in this process when the database can be opened, else (the embedded
 * database is held by a running server) through that server's loopback admin endpoint.
 */
async function runData<C extends AdminCommand>(cfg: Config, command: C): Promise<AdminResult<C>> {
  checkDataExists(cfg, command);
  if (cfg.database_url) {
    const problem = await postgresProblem(cfg.database_url);
    if (problem) throw new AppError('SOURCE_UNAVAILABLE', problem);
  } else {
    const holder = lockHolder(cfg.pglite_dir);
    if (holder) return runViaServer(cfg, command, holder.pid);
  }
  // A command that makes the embedded database (a fresh data directory) is its first start: the first
  // run happens here as it would in `serve` — demo data, the demo agent, the chair and the admin — and its
  // banner goes to stderr. Claude Desktop's way in begins with `agent add`, before any serve.
  const fresh = !cfg.database_url && command.command !== 'migrate' && !fs.existsSync(cfg.pglite_dir);
  const { openDatabase } = await import('./db/knex.ts');
  let db;
  try {
    db = await openDatabase({
      url: cfg.database_url,
      pgliteDir: cfg.pglite_dir,
      command: `countersign ${command.command}`,
    });
  } catch (e) {
    const holder = lockedBy(e);
    if (holder) return runViaServer(cfg, command, holder.pid);
    throw e;
  }
  try {
    const [{ runAdminCommand }, { adminDeps }, { createBlobStore }] = await Promise.all([
      import('./admin/commands.ts'),
      import('./app/admin-deps.ts'),
      import('./connectors/local/blobs.ts'),
    ]);
    const deps = adminDeps({
      knex: db.knex,
      blobs: createBlobStore(path.join(cfg.data_dir, 'blobs')),
      config: cfg,
    });
    if (command.command !== 'migrate') await deps.migrate();
    if (fresh && cfg.demo) await firstRunHere(deps);
    return await runAdminCommand(deps, command);
  } finally {
    await db.close();
  }
}

/** The first line of stdin: typed without echo at a terminal (prompted on stderr), else piped. */
async function readSecretLine(prompt: string): Promise<string> {
  if (process.stdin.isTTY) {
    process.stderr.write(prompt);
    const line = await readHiddenLine(process.stdin, process.stderr);
    if (!line) throw new AppError('CONFIG_INVALID', 'no password given');
    return line;
  }
  let data = '';
  for await (const chunk of process.stdin) {
    data += String(chunk);
    if (data.includes('\n')) break;
  }
  const line = data.split(/\r?\n/)[0] ?? '';
  if (!line) throw new AppError('CONFIG_INVALID', 'no password given (stdin was empty)');
  return line;
}

/** The password of `--as USER`: COUNTERSIGN_PASSWORD, or the first line of stdin; a refusal names both. */
const chairPassword = async () => {
  if (process.env.COUNTERSIGN_PASSWORD) return process.env.COUNTERSIGN_PASSWORD;
  try {
    return await readSecretLine('password: ');
  } catch (e) {
    if (!isAppError(e, 'CONFIG_INVALID')) throw e;
    throw new AppError(
      'CONFIG_INVALID',
      `${e.message}: --as USER signs in with a password, from COUNTERSIGN_PASSWORD or the first line of stdin ` +
        '(typed at the prompt when stdin is a terminal)',
      undefined,
      { cause: e },
    );
  }
};

/** The contents of a file the command line names; a file that cannot be read is a plain refusal. */
function readNamedFile(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new AppError('NOT_FOUND', `cannot read ${file}: ${(e as Error).message}`, undefined, { cause: e });
  }
}

/** A request as a chair reads it: agent-supplied text with every invisible character as a marker. */
function printApproval(a: AdminResults['approvals.show']['approval'], prefix: string): void {
  const { target_flags: flags, ...shown } = (a.review ?? {}) as Record<string, unknown>;
  const hidden = countHiddenIn([a.target.target_id, a.target.display_name, shown]);
  out(`request     ${a.approval_request_id}`);
  out(`status      ${a.status}${a.approval_id ? `  (approval_id ${a.approval_id})` : ''}`);
  out(`tool        ${agentToolName(a.tool, prefix)}   agent ${a.agent_name}`);
  if (hidden > 0) {
    out(
      `WARNING     ${hidden} invisible or reordering character(s), each shown as a marker such as ⟦U+202E …⟧`,
    );
  }
  out(
    `target      ${marked(`${a.target.target_type} ${a.target.target_id} (${a.target.display_name ?? '?'})`)}`,
  );
  for (const l of lookalikes(flags)) out(`looks like  ${marked(`${l.display_name} (${l.target_id})`)}`);
  out(`source      ${a.source ?? '(not recorded)'}`);
  out(`rule        ${a.rule.asks}`);
  out(`approvers   ${a.approvers.join(', ') || '-'} (${a.rule.progress})`);
  if (a.viewer && !a.viewer.may) out(`read-only   ${a.viewer.reason}`);
  out(`created     ${a.created_at}   expires ${a.expires_at}`);
  if (a.note) out(`note        ${marked(a.note)}`);
  if (a.review) out(`content     ${marked(JSON.stringify(shown, null, 2))}`);
}

/** The directory entries a request's target looks like (review.target_flags.looks_like). */
function lookalikes(flags: unknown): { target_id: string; display_name: string }[] {
  const list = (flags as { looks_like?: unknown } | undefined)?.looks_like;
  return Array.isArray(list) ? (list as { target_id: string; display_name: string }[]) : [];
}

function summary(imported: ImportSummary): string {
  return Object.entries(imported)
    .map(([k, v]) => `${v} ${k}`)
    .join(', ');
}

/** Writes to stderr and resolves once the text has been handed to the OS (or fails if it could not be). */
const errFlushed = (text: string) =>
  new Promise<void>((resolve, reject) => process.stderr.write(text, (e) => (e ? reject(e) : resolve())));

/**
 * The first-run banner. Recorded as shown only once it has been written out: a start that dies before
 * that leaves the next start to make new credentials and show them.
 */
async function showFirstRun(
  first: FirstRun | undefined,
  where: { mcp: string; web?: string; file?: string },
) {
  if (!first) return;
  const lines = [
    '',
    first.renewed
      ? 'countersign: first run, continued — the last start ended before showing its credentials; these replace them.'
      : 'countersign: first run — demo data loaded and an agent named "demo" created.',
    `  MCP endpoint: ${where.mcp}`,
    `  demo agent token (shown once): ${first.token}`,
  ];
  if (first.chair) {
    if (where.web) lines.push(`  approvals web form: ${where.web}/approvals`);
    lines.push(`  chair login (shown once): ${first.chair.name} / ${first.chair.password}`);
  }
  if (first.admin) {
    if (where.web) lines.push(`  audit log and administration: ${where.web}/audit`);
    lines.push(`  admin and compliance login (shown once): ${first.admin.name} / ${first.admin.password}`);
  }
  if (where.file) {
    // Written before it is shown, so that a start that shows it has kept it too.
    fs.rmSync(where.file, { force: true });
    fs.writeFileSync(where.file, `${lines.join('\n').trim()}\n`, { mode: 0o600, flag: 'wx' });
    lines.push(`  (also written to ${where.file}, readable by you alone: delete it once you have kept them)`);
  }
  await errFlushed(`${lines.join('\n')}\n\n`);
  await first.markShown();
}

/** The first run of a fresh data directory, from a command other than serve; its banner on stderr. */
async function firstRunHere(deps: AdminDeps): Promise<void> {
  const { firstRun } = await import('./admin/first-run.ts');
  const first = await firstRun(deps);
  const web = publicBaseUrl(deps.config);
  await showFirstRun(first, {
    mcp: `start the server: countersign serve (HTTP, ${web}/mcp) or countersign serve --stdio`,
    web,
  });
}

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

/** The file a stdio first run also writes its banner to: Claude Desktop keeps stderr only in its log. */
const FIRST_RUN_FILE = 'first-run-credentials.txt';

/** Where a stdio server's web form is; when it is not served, one line with the fix and the way to approve. */
async function showStdioReady(ready: StdioReady, cfg: Config): Promise<void> {
  const cliWay = 'chairs approve with: countersign approvals approve <id> --as <user>';
  if (ready.web.state === 'port_in_use')
    err(`countersign: port ${ready.web.port} is in use; set COUNTERSIGN_PORT or pass --no-web (${cliWay})`);
  if (ready.web.state === 'failed')
    err(
      `countersign: the web form is not served: ${ready.web.message}; set COUNTERSIGN_HOST/COUNTERSIGN_PORT or pass --no-web (${cliWay})`,
    );
  const web = ready.web.state === 'serving' ? ready.web.url : cfg.http.public_url;
  // Claude Desktop keeps a stdio server's stderr only in its log: the credentials go to a file as well.
  await showFirstRun(ready.firstRun, {
    mcp: 'stdio (set COUNTERSIGN_AGENT_TOKEN to the token below)',
    web,
    file: path.join(cfg.data_dir, FIRST_RUN_FILE),
  });
}

/**
 * `serve --stdio`: joins the server that already holds the embedded database (relaying stdin/stdout to
 * its MCP endpoint), else serves the database itself. Which of the two it does is said on stderr (stdout
 * is the MCP channel).
 */
async function serveOrJoinStdio(cfg: Config, log: Logger, web: boolean): Promise<void> {
  const token = process.env.COUNTERSIGN_AGENT_TOKEN;
  const { findRunningServer } = await import('./app/stdio-join.ts');
  const target = await findRunningServer(cfg, err);
  if (target) return joinRunningServer(cfg, target, token, log);
  err(
    cfg.database_url
      ? 'countersign: stdio serves the PostgreSQL database of DATABASE_URL itself (servers beside it share it)'
      : `countersign: stdio serves the data directory ${cfg.data_dir} itself (no running server holds it)`,
  );
  const { serveStdio } = await import('./app/serve-stdio.ts');
  try {
    await serveStdio(cfg, log, token, { web, onReady: (ready) => showStdioReady(ready, cfg) });
  } catch (e) {
    // A server took the database between the look above and the open: join it after all.
    if (!lockedBy(e)) throw e;
    const late = await findRunningServer(cfg, err);
    if (!late) throw e;
    return joinRunningServer(cfg, late, token, log);
  }
}

async function joinRunningServer(cfg: Config, target: JoinTarget, token: string | undefined, log: Logger) {
  err(
    `countersign: joined the running server (pid ${target.pid}): relaying this stdio connection to ${target.mcp}`,
  );
  const { checkJoinedToken, relayStdio } = await import('./app/stdio-relay.ts');
  await checkJoinedToken(target, token);
  await relayStdio(cfg, target, token, log);
}

async function serve(opts: { stdio?: boolean; web: boolean }): Promise<void> {
  const cfg = config();
  const { createLogger } = await import('./log.ts');
  const log = createLogger(cfg.log_level);
  if (opts.stdio) return serveOrJoinStdio(cfg, log, opts.web);
  if (!opts.web)
    throw usageError("option '--no-web' is for --stdio: an HTTP server serves the web UI with /mcp");
  const { startHttpServer } = await import('./app/serve-http.ts');
  // Listened for from the start: a signal during start-up stops the server cleanly once it is up.
  const signalled = new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
  // A signal while start-up waits for the database stops it there: nothing has been recorded yet.
  const started = startHttpServer(cfg, log);
  const server = await Promise.race([started, signalled.then(() => undefined)]);
  if (!server) {
    log.info('countersign stopped while starting');
    process.exit(0);
  }
  try {
    await showFirstRun(server.services.firstRun, { mcp: `${server.url}/mcp`, web: server.url });
    // A later start says how to get logins again: the first start's were printed that once.
    if (!server.services.firstRun && cfg.demo)
      err(
        `countersign: serving ${server.url}/mcp; the demo logins were printed at the first start only. ` +
          'New ones: countersign agent rotate demo, countersign user reset-password chair (or admin)',
      );
  } catch (e) {
    await server.close('error');
    throw e;
  }
  await signalled;
  await server.close('signal');
}

/** Only an installed profile; the profiles directory comes from the configuration. */
const profile = installedProfile(() => config().policy.profiles_dir);

type ExportOptions = Record<
  'since' | 'until' | 'agent' | 'tool' | 'kind' | 'result' | 'target' | 'approval',
  string | undefined
> & {
  format?: 'jsonl' | 'csv';
  output?: string;
  force?: boolean;
};

/**
 * The export's format and file: the format from --format or else from the extension of -o FILE, the two
 * never contradicting, and FILE (or its manifest) never overwritten without --force.
 */
function exportTarget(opts: ExportOptions): { format: 'jsonl' | 'csv'; file: string } {
  const fromName = opts.output === undefined ? undefined : formatOfFile(opts.output);
  if (opts.output !== undefined && !fromName && !opts.format)
    throw usageError(
      `option '-o, --output <file>': ${opts.output} must end in .jsonl or .csv, or give --format`,
    );
  if (opts.format && fromName && opts.format !== fromName)
    throw usageError(`option '--format ${opts.format}' contradicts -o ${opts.output} (.${fromName})`);
  const format = opts.format ?? fromName;
  if (!format) throw usageError(`option '--format <format>' (jsonl or csv) is required without -o FILE`);
  const file = path.resolve(
    opts.output ?? `audit-${new Date().toISOString().replace(/[:.]/g, '-')}.${format}`,
  );
  for (const existing of [file, `${file}.manifest.json`].filter((f) => fs.existsSync(f))) {
    if (!opts.force)
      throw usageError(`option '-o, --output <file>': ${existing} exists; give --force to overwrite it`);
  }
  return { format, file };
}

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

  cli
    .command('serve', { isDefault: true })
    .description('serve MCP over Streamable HTTP (default) or stdio')
    .option('--stdio', 'serve one agent over stdin/stdout (token from COUNTERSIGN_AGENT_TOKEN)')
    .option('--no-web', 'with --stdio: do not serve the web UI (approval and audit pages) on the HTTP port')
    .action(serve);
  addStoreCommands(cli);
  addDbCommands(cli.command('db').description('move the database: copy the embedded one into PostgreSQL'));
  const agentCommand = cli.command('agent').description('manage agents (MCP clients)');
  addAgentCommands(agentCommand);
  addAuditCommands(cli.command('audit').description('export and verify the audit log'));
  const user = cli
    .command('user')
    .description('manage people: chairs decide, compliance reviews, admins administer');
  addUserCommands(user);
  addResealCommands(agentCommand, user);
  addUserLinkCommand(user);
  addApprovalCommands(
    cli
      .command('approvals')
      .description(
        'review and decide approval requests as a chair (password from COUNTERSIGN_PASSWORD or stdin)',
      ),
  );
  addPolicyCommands(
    cli.command('policy').description('approval rules: who must countersign what (docs/policy.md)'),
  );
  addUpstreamCommands(
    cli.command('upstream').description("upstream MCP servers: their tools' pinned classes (read or write)"),
  );
  return cli;
}

/** migrate, demo, import: the database's schema and the local store's contents. */
function addStoreCommands(cli: Command): void {
  cli
    .command('migrate')
    .description('apply database migrations')
    .action(async () => {
      const { applied } = await runData(config(), { command: 'migrate' });
      out(applied.length > 0 ? `applied: ${applied.join(', ')}` : 'database is up to date');
    });

  cli
    .command('demo')
    .description('load the multilingual demo directory into the local store')
    .action(async () => {
      const { imported } = await runData(config(), { command: 'demo' });
      out(`imported ${summary(imported)}`);
    });

  cli
    .command('import')
    .argument('<file>', 'JSON (contacts, groups, conversations, messages, files) or CSV (contacts)')
    .description('load contacts, groups and messages into the local store')
    .action(async (file: string) => {
      const text = readNamedFile(file);
      const { imported } = await runData(config(), {
        command: 'import',
        file_name: path.basename(file),
        text,
      });
      out(`imported ${summary(imported)}`);
    });
}

/** db copy: the embedded database into an empty PostgreSQL database, verified there (docs/operations.md). */
function addDbCommands(db: Command): void {
  db.command('copy')
    .requiredOption('--to <url>', 'an empty PostgreSQL database: postgres://user:password@host:5432/name')
    .description('copy the embedded database into an empty PostgreSQL database and verify the copy')
    .action(async (opts: { to: string }) => {
      const { copyToPostgres, describeCopy, REFUSED } = await import('./admin/db-copy.ts');
      const cfg = config();
      try {
        for (const line of describeCopy(await copyToPostgres(cfg, opts.to), cfg)) out(line);
      } catch (e) {
        // A refused command line or target changed nothing: exit 2, like any usage error.
        throw isAppError(e, 'CONFIG_INVALID', REFUSED) ? usageError(e.message) : e;
      }
    });
}

/** A listed record that does not carry its seal (docs/identity.md, "Sealed records"), marked so. */
const tampered = (r: { sealed?: boolean }) =>
  r.sealed === false ? '\tTAMPERED (changed outside the server: check it, then reseal it)' : '';

/**
 * `agent reseal`, `user reseal`: the operator on the host accepts a record as it now stands
 * (docs/identity.md, "Sealed records"); what was sealed is printed and audited.
 */
function addResealCommands(agent: Command, user: Command): void {
  agent
    .command('reseal')
    .argument('<name>')
    .description(
      "accept an agent's record as it now stands (after checking it): seal its profile, limit, owner, token and revocation again",
    )
    .action(async (name: string) => {
      const result = await runData(config(), { command: 'agent.reseal', name, actor: cliActor() });
      out(`agent "${name}" sealed as it stands${result.was_sealed ? ' (it was already sealed)' : ''}:`);
      out(JSON.stringify(result.sealed, null, 2));
    });
  user
    .command('reseal')
    .argument('<name>')
    .description(
      "accept a user's record as it now stands (after checking it): seal its roles, teams, e-mail, password and identity again",
    )
    .action(async (name: string) => {
      const result = await runData(config(), { command: 'user.reseal', name, actor: cliActor() });
      out(`user "${name}" sealed as it stands${result.was_sealed ? ' (it was already sealed)' : ''}:`);
      out(JSON.stringify(result.sealed, null, 2));
    });
}

function addAgentCommands(agent: Command): void {
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
}

function addAuditCommands(audit: Command): void {
  audit
    .command('export')
    .addOption(
      new Option('--format <format>', 'default: from the extension of -o FILE').choices(CHOICES.format),
    )
    .option('--since <time>', 'ISO-8601: rows at or after', isoTime)
    .option('--until <time>', 'ISO-8601: rows before', isoTime)
    .option('--agent <name>', 'only rows of this agent')
    .option('--tool <tool>', 'only rows of this tool')
    .addOption(new Option('--kind <kind>', 'only rows of this kind').choices(CHOICES.kind))
    .addOption(new Option('--result <result>', 'only ok or error rows').choices(CHOICES.result))
    .option('--target <ref>', 'only rows about this target (contact, group, conversation or tool id)')
    .option('--approval <id>', 'only rows of this approval (approval_request_id or approval_id)')
    .option(
      '-o, --output <file>',
      'where to write (default audit-<time>.<format>); the manifest goes beside it',
    )
    .option('--force', 'overwrite FILE and its manifest if they exist')
    .description('export the log with a signed manifest (FILE.manifest.json)')
    .action(exportAudit);
  audit
    .command('verify')
    .argument('[file]', 'an export (JSONL or CSV)')
    .option('--manifest <file>', 'its manifest (default FILE.manifest.json)')
    .option(
      '--pubkey <file>',
      'a public key (PEM) to trust: it must have signed the export and the checkpoints (again for each ' +
        'earlier key, after a rotation)',
      (file: string, files: string[] = []) => [...files, file],
    )
    .option(
      '--fingerprint <hex>',
      "a key to trust by its SHA-256 fingerprint (64 hex digits; 'countersign audit key --fingerprint' " +
        "prints the server's); may be repeated",
      (hex: string, all: string[] = []) => [...all, hex],
    )
    .option(
      '--trust <file>',
      'a trust file: the public keys (PEM) and fingerprints (one a line, # comments) to trust',
    )
    .option(
      '--accept-unpinned-key',
      'exit 0 on an intact export even though no key was pinned (proves integrity, not origin)',
    )
    .option('--db', 'verify the live table instead of an export')
    .option(
      '--require-anchored',
      'fail when rows follow the last checkpoint recorded in the chain (an export needs a pinned key)',
    )
    .option(
      '--tsa-cert <file>',
      "check the time-stamp anchors against this TSA certificate or its CA's (PEM)",
    )
    .option(
      '--tsa-max-skew <seconds>',
      "how far a token's genTime may lie from its checkpoint's time (default audit.anchors.tsa_max_skew_s)",
    )
    .option('--witness <dir>', 'check the chain against the heads of this witness directory')
    .option('--anchors <file>', "the export's anchors (default FILE.anchors.jsonl)")
    .description(
      'verify an export offline against the keys you pin, or the live table; exit 0 only when ' +
        'everything is valid (offline: and signed by a pinned key, unless --accept-unpinned-key)',
    )
    .action(verifyAudit);
  audit
    .command('accept-restore')
    .requiredOption('--reason <text>', 'why the log goes back to the restored head (kept in the audit row)')
    .description(
      'accept a database restored from a backup: give up the newer signed heads it no longer holds, ' +
        'audited; restart the replicas after it',
    )
    .action(acceptRestoreCommand);
  audit
    .command('key')
    .option('--fingerprint', 'print only its SHA-256 fingerprint')
    .description("print the public half of this host's audit signing key (PEM), to pin when verifying")
    .action(printAuditKey);
}

/** `audit export`: the filter as given (empty options left out), written where exportTarget says. */
async function exportAudit(opts: ExportOptions): Promise<void> {
  const { format, file } = exportTarget(opts);
  const filter = Object.fromEntries(
    (['since', 'until', 'tool', 'kind', 'result', 'approval'] as const)
      .filter((k) => opts[k])
      .map((k) => [k, opts[k]]),
  ) as Extract<AdminCommand, { command: 'audit.export' }>['filter'];
  if (opts.target) filter.target_ref = opts.target;
  const result = await runData(config(), {
    command: 'audit.export',
    format,
    filter,
    agent: opts.agent,
    path: file,
    actor: `cli:${os.userInfo().username}`,
  });
  out(`exported ${result.row_count} rows to ${result.path}`);
  out(`manifest: ${result.manifest_path} (checkpoint at seq ${result.checkpoint_seq})`);
}

/** `audit accept-restore`: the heads given up and the row that says so. */
async function acceptRestoreCommand(opts: { reason: string }): Promise<void> {
  const result = await runData(config(), {
    command: 'audit.accept_restore',
    reason: opts.reason,
    actor: cliActor(),
  });
  for (const h of result.given_up)
    out(`gave up the ${h.source.replace('_', ' ')} at seq ${h.seq} (${h.head_hash})`);
  out(`restored head: seq ${result.restored_head?.seq ?? 0}; accepted in audit row ${result.seq}`);
  out('restart every replica: each checks the chain from that row on');
}

interface VerifyOptions {
  manifest?: string;
  pubkey?: string[];
  fingerprint?: string[];
  trust?: string;
  acceptUnpinnedKey?: boolean;
  db?: boolean;
  requireAnchored?: boolean;
  tsaCert?: string;
  tsaMaxSkew?: string;
  witness?: string;
  anchors?: string;
}

/** The keys pinned by --pubkey, --fingerprint and --trust; each refused, naming it, unless it reads as one. */
async function pinsOf(opts: VerifyOptions) {
  const { parseFingerprint, parsePublicKey, parseTrustFile } = await import('./audit/pins.ts');
  const trusted = opts.trust === undefined ? undefined : parseTrustFile(readInput(opts.trust), opts.trust);
  return {
    pems: [...(opts.pubkey ?? []).map((f) => parsePublicKey(readInput(f), f)), ...(trusted?.pems ?? [])],
    fingerprints: [
      ...(opts.fingerprint ?? []).map((hex) => parseFingerprint(hex, '--fingerprint')),
      ...(trusted?.fingerprints ?? []),
    ],
  };
}

/** `audit verify`: an export offline against its manifest, or with --db the live table. */
async function verifyAudit(file: string | undefined, opts: VerifyOptions): Promise<void> {
  const pins = await pinsOf(opts);
  const tsaCertPem = opts.tsaCert === undefined ? undefined : readInput(opts.tsaCert);
  const witnessDir = opts.witness === undefined ? undefined : path.resolve(opts.witness);
  if (opts.db) {
    if (pins.fingerprints.length > 0)
      throw usageError(
        'audit verify --db: pin keys with --pubkey (or PEM keys in --trust), not fingerprints',
      );
    const result = await runData(config(), {
      command: 'audit.verify_db',
      ...(pins.pems.length > 0 ? { pubkeys: pins.pems } : {}),
      ...(tsaCertPem ? { tsa_cert: tsaCertPem } : {}),
      ...(witnessDir ? { witness_dir: witnessDir } : {}),
    });
    out(result.summary);
    if (!result.ok || (opts.requireAnchored && result.tail)) process.exitCode = 1;
    // Anchored means signed by a key the database cannot swap: one given, or the host's own key file.
    if (opts.requireAnchored && result.key_source !== 'given' && result.key_source !== 'host') {
      err(
        'audit verify --db --require-anchored: no pinned key (give --pubkey, or run on the host with its ' +
          'data directory); the key the database records proves nothing about who anchored it',
      );
      process.exitCode = 1;
    }
    return;
  }
  if (!file) throw usageError('audit verify: give an export file, or --db');
  const isPinned = pins.pems.length + pins.fingerprints.length > 0;
  if (opts.requireAnchored && !isPinned)
    throw usageError(
      'audit verify --require-anchored: pin the signing key (--pubkey, --fingerprint or --trust); ' +
        "a manifest's own key proves nothing about who anchored it",
    );
  const manifest = readManifest(file, opts.manifest);
  const [{ describeReport, verifyExport }, { describeOrigin, trustedKeys }] = await Promise.all([
    import('./audit/verify-export.ts'),
    import('./audit/pins.ts'),
  ]);
  const keys = trustedKeys(pins, manifest);
  const report = await verifyExport(file, manifest, keys.length > 0 ? keys : undefined);
  out(describeReport(report));
  const origin = describeOrigin(pins, manifest);
  out(origin.text);
  if (!report.ok || (opts.requireAnchored && report.tail)) process.exitCode = 1;
  if (!origin.ok && (isPinned || !opts.acceptUnpinnedKey)) process.exitCode = 1;
  if (tsaCertPem === undefined && witnessDir === undefined) return;
  const [{ verifyExportAnchors }, { describeAnchors }] = await Promise.all([
    import('./audit/anchors/verify-anchors.ts'),
    import('./audit/anchors/check.ts'),
  ]);
  const anchors = await verifyExportAnchors(file, manifest, {
    tsaCertPem,
    witnessDir,
    anchorsFile: opts.anchors,
    tsaMaxSkewS: maxSkewOf(opts.tsaMaxSkew),
  });
  out(describeAnchors(anchors));
  if (!anchors.ok) process.exitCode = 1;
}

/** --tsa-max-skew as seconds, else the configured bound (defaults apply without a config file). */
function maxSkewOf(given: string | undefined): number {
  if (given === undefined) return config().audit.anchors.tsa_max_skew_s;
  const seconds = Number(given);
  if (!Number.isSafeInteger(seconds) || seconds <= 0)
    throw usageError(`option '--tsa-max-skew <seconds>': "${given}" is not a positive whole number`);
  return seconds;
}

/** The export's manifest (beside it unless named), and the export readable; else NOT_FOUND, saying where to look. */
function readManifest(file: string, named: string | undefined): Manifest {
  const manifestPath = named ?? `${file}.manifest.json`;
  try {
    const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8')) as Manifest;
    fs.accessSync(file, fs.constants.R_OK);
    return manifest;
  } catch (e) {
    const missing = (e as NodeJS.ErrnoException).path;
    // The manifest is looked for beside the export unless named: say so when that is what is missing.
    const hint =
      missing === manifestPath && named === undefined
        ? `; an export's manifest is written beside it as FILE.manifest.json: give another with --manifest FILE`
        : '';
    throw new AppError(
      'NOT_FOUND',
      `cannot read ${missing ?? manifestPath}: ${(e as Error).message}${hint}`,
      undefined,
      { cause: e },
    );
  }
}

/** `audit key`: the public half of the configured signing key, read (never created) from the host. */
async function printAuditKey(opts: { fingerprint?: boolean }): Promise<void> {
  const cfg = config();
  const file = cfg.audit.signing_key_path ?? path.join(cfg.data_dir, 'audit-signing-key.pem');
  let pem: string;
  try {
    pem = createPublicKey(createPrivateKey(fs.readFileSync(file)))
      .export({ format: 'pem', type: 'spki' })
      .toString();
  } catch (e) {
    throw new AppError(
      'NOT_FOUND',
      `cannot read the audit signing key ${file}: ${(e as Error).message}`,
      undefined,
      {
        cause: e,
      },
    );
  }
  const { fingerprintOf } = await import('./audit/pins.ts');
  out(opts.fingerprint ? `sha256:${fingerprintOf(pem)}` : pem.trimEnd());
}

/** A file the operator named, read whole; one that cannot be read is NOT_FOUND, naming it. */
function readInput(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new AppError('NOT_FOUND', `cannot read ${file}: ${(e as Error).message}`, undefined, { cause: e });
  }
}

function addUserCommands(user: Command): void {
  user
    .command('add')
    .argument('<name>')
    .requiredOption('--role <roles>', 'chair, compliance or admin (comma-separated for several)', roles)
    .description('create a user; the password is read from stdin (first line)')
    .action(async (name: string, opts: { role: Role[] }) => {
      const password = await readSecretLine('password for the new user: ');
      const { user: created } = await runData(config(), {
        command: 'user.add',
        actor: cliActor(),
        name,
        roles: opts.role,
        password,
      });
      out(`user "${created.name}" created with roles ${created.roles.join(', ')}`);
    });
  user
    .command('list')
    .description('list users: name, roles, active or disabled')
    .action(async () => {
      const { users } = await runData(config(), { command: 'user.list' });
      for (const u of users) {
        const state = u.disabled_at ? `disabled ${u.disabled_at}` : 'active';
        const roles = [...u.roles, ...u.teams].join(',');
        out(`${u.name}\t${roles}\t${state}${u.email ? `\t${u.email}` : ''}${tampered(u)}`);
      }
    });
  user
    .command('set')
    .argument('<name>')
    .option('--role <roles>', 'the new roles: chair, compliance, admin (comma-separated)', roles)
    .option('--email <address>', 'where notices of requests reach this chair ("none" clears it)')
    .option('--team <teams>', 'the teams approval rules may ask for, e.g. finance,legal ("none" clears them)')
    .description("change a user's roles (the last active admin keeps admin), teams or e-mail address")
    .action(async (name: string, opts: { role?: Role[]; email?: string; team?: string }) => {
      if (!opts.role && opts.email === undefined && opts.team === undefined)
        throw usageError('give --role, --team or --email');
      if (opts.role) {
        const result = await runData(config(), {
          command: 'user.set',
          name,
          roles: opts.role,
          actor: cliActor(),
        });
        out(`user "${result.user}" now has roles ${result.roles.join(', ')}`);
      }
      if (opts.team !== undefined) {
        const teams = opts.team === 'none' ? [] : opts.team.split(',').map((t) => t.trim());
        const result = await runData(config(), { command: 'user.set_teams', name, teams, actor: cliActor() });
        out(
          `user "${result.user}" is now in ${result.teams.length ? `teams ${result.teams.join(', ')}` : 'no team'}`,
        );
      }
      if (opts.email !== undefined) {
        const email = opts.email === 'none' ? null : opts.email;
        const result = await runData(config(), { command: 'user.set_email', name, email, actor: cliActor() });
        const now = result.email ? `now has e-mail ${result.email}` : 'has no e-mail address';
        out(`user "${result.user}" ${now}`);
      }
    });
  user
    .command('reset-password')
    .argument('<name>')
    .description("set a user's password, read from stdin (first line); their web sessions end")
    .action(async (name: string) => {
      const password = await readSecretLine(`new password for ${name}: `);
      await runData(config(), { command: 'user.reset_password', name, password, actor: cliActor() });
      out(`password of user "${name}" reset; their web sessions have ended`);
    });
  user
    .command('disable')
    .argument('<name>')
    .description('disable a user: sign-ins are refused and sessions end at once (not the last active admin)')
    .action(async (name: string) => {
      await runData(config(), { command: 'user.disable', name, actor: cliActor() });
      out(`user "${name}" disabled`);
    });
}

/** `user link`: a single sign-on identity signs in as an existing user from then on. */
function addUserLinkCommand(user: Command): void {
  user
    .command('link')
    .argument('<name>', 'an existing user')
    .requiredOption('--subject <sub>', "the person's subject (sub) at the single sign-on provider")
    .option('--issuer <url>', 'the provider (default: web.oidc.issuer)')
    .description(
      'link a single sign-on identity to an existing user: it signs in as that user from then on (audited)',
    )
    .action(async (name: string, opts: { subject: string; issuer?: string }) => {
      const result = await runData(config(), {
        command: 'user.link',
        name,
        subject: opts.subject,
        issuer: opts.issuer,
        actor: cliActor(),
      });
      const what = `${result.issuer} subject ${result.subject}`;
      out(
        result.unchanged
          ? `user "${result.user}" is already linked to ${what}`
          : `user "${result.user}" linked to ${what}`,
      );
    });
}

function addApprovalCommands(approvals: Command): void {
  approvals
    .command('list')
    .requiredOption('--as <user>', 'your user name')
    .addOption(new Option('--status <status>', 'which requests').choices(CHOICES.status).default('pending'))
    .option(
      '--waiting-for-me',
      'only requests you can decide now (pending, undecided by you, a rule you are among)',
    )
    .action(async (opts: { as: string; status: string; waitingForMe?: boolean }) => {
      const password = await chairPassword();
      const cfg = config();
      const { approvals: rows } = await runData(cfg, {
        command: 'approvals.list',
        as: opts.as,
        password,
        status: opts.status,
        waiting_for_me: opts.waitingForMe,
      });
      if (rows.length === 0) out(`no ${opts.status} requests`);
      for (const a of rows) {
        out(
          `${a.approval_request_id}\t${a.status}\t${agentToolName(a.tool, cfg.tools.prefix)}\t${a.agent_name}\t` +
            `${a.target.target_type}:${a.target.target_id}\t${a.created_at}\texpires ${a.expires_at}`,
        );
      }
    });
  approvals
    .command('show')
    .argument('<id>', 'approval request id')
    .requiredOption('--as <user>', 'your user name')
    .action(async (id: string, opts: { as: string }) => {
      const password = await chairPassword();
      const cfg = config();
      const { approval } = await runData(cfg, { command: 'approvals.show', as: opts.as, password, id });
      printApproval(approval, cfg.tools.prefix);
    });
  for (const decision of ['approve', 'reject'] as const) {
    approvals
      .command(decision)
      .argument('<id>', 'approval request id')
      .requiredOption('--as <user>', 'your user name (must hold the chair role)')
      .option(
        '--note <text>',
        decision === 'reject' ? 'why (required)' : 'a note for the agent and the audit log',
      )
      .action(async (id: string, opts: { as: string; note?: string }) => {
        if (decision === 'reject' && !opts.note) throw usageError('reject needs --note');
        const password = await chairPassword();
        const { approval } = await runData(config(), {
          command: 'approvals.decide',
          as: opts.as,
          password,
          id,
          decision,
          note: opts.note,
        });
        // After the first of several approvals, how far it is: "pending (1 of 2 approvals)".
        const tally =
          approval.status === 'pending' && approval.required_approvers > 1
            ? ` (${approval.approvers.length} of ${approval.required_approvers} approvals)`
            : '';
        out(`${approval.approval_request_id} is ${approval.status}${tally}`);
        if (approval.approval_id) out(approval.approval_id);
      });
  }
}

/** One pinned tool: its class (and the config's mapping, which wins), and any less gated class held back. */
function printPin(p: AdminResults['upstream.list']['pins'][number]): void {
  const config = p.config ? ` (config: ${p.config})` : '';
  const accepted = p.accepted_by ? `, accepted by ${p.accepted_by}` : '';
  out(
    `${p.upstream}__${p.tool}\t${p.class}${config}\tschema ${p.input_schema_sha256.slice(0, 12)}\t` +
      `pinned ${p.pinned_at}${accepted}`,
  );
  if (p.pending) {
    out(
      `  held: listed as ${p.pending.class} since ${p.pending.since ?? '?'}; ` +
        `to accept: countersign upstream accept ${p.upstream} ${p.tool}`,
    );
  }
}

/** A policy file as JSON; a file that cannot be read or parsed is a structured error naming it. */
function readPolicyFile(file: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new AppError('NOT_FOUND', `cannot read ${file}: ${(e as Error).message}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new AppError(
      'CONFIG_INVALID',
      `${file} is not valid JSON: ${(e as Error).message}`,
      'policy_invalid',
    );
  }
}

/**
 * `policy check`'s look at the users: the rules no request could get through as they stand now, as
 * warnings on stderr. Only where there is a database to ask (check never creates one); a database that
 * cannot be asked is said, and the compile check stands.
 */
async function warnUnsatisfiable(cfg: Config, doc: unknown): Promise<void> {
  if (!cfg.database_url && !fs.existsSync(cfg.pglite_dir)) return;
  try {
    const { warnings } = await runData(cfg, { command: 'policy.warnings', policy: doc });
    for (const w of warnings) err(`warning: ${w}`);
  } catch (e) {
    err(`note: the rules were not checked against the users: ${(e as Error).message}`);
  }
}

function addPolicyCommands(policy: Command): void {
  policy
    .command('check')
    .argument('<file>', 'a policy file: {"timezone": …, "rules": [{"name", "when", "then"}]}')
    .description('type-check every rule of a policy file, nothing stored; prints its version')
    .action(async (file: string) => {
      const { compilePolicy } = await import('./approval/index.ts');
      const cfg = config();
      const doc = readPolicyFile(file);
      const compiled = compilePolicy(doc, cfg.approval.required_approvers);
      out(`${file}: ${compiled.doc.rules.length} rule(s) compile; version ${compiled.version}`);
      await warnUnsatisfiable(cfg, doc);
    });
  policy
    .command('set')
    .argument('<file>', 'a policy file, as policy check reads it')
    .description('store a policy for every replica on this database (audited as policy.changed)')
    .action(async (file: string) => {
      const doc = readPolicyFile(file);
      const result = await runData(config(), { command: 'policy.set', policy: doc, actor: cliActor() });
      out(
        `policy stored: version ${result.after}${result.changed ? ` (was ${result.before})` : ' (unchanged)'}`,
      );
      for (const w of result.warnings) err(`warning: ${w}`);
    });
  policy
    .command('show')
    .description('the policy in force, where it comes from (database or config) and its version')
    .action(async () => {
      const shown = await runData(config(), { command: 'policy.show' });
      out(`version ${shown.version} (from the ${shown.origin})`);
      out(JSON.stringify(shown.policy, null, 2));
    });
  policy
    .command('explain')
    .requiredOption('--tool <tool>', 'the tool as agents call it, e.g. isphere_send_message')
    .requiredOption('--args <json>', "the call's arguments as a JSON object")
    .option('--agent <name>', 'the calling agent (for agent.name and agent.owner)')
    .option('--file <file>', 'a policy file to explain instead of the policy in force (nothing stored)')
    .description('which rule a call would meet and what it would ask, nothing drafted')
    .action(async (opts: { tool: string; args: string; agent?: string; file?: string }) => {
      let args: unknown;
      try {
        args = JSON.parse(opts.args) as unknown;
      } catch (e) {
        throw usageError(`--args is not valid JSON: ${(e as Error).message}`);
      }
      if (typeof args !== 'object' || args === null || Array.isArray(args))
        throw usageError('--args must be a JSON object');
      const r = await runData(config(), {
        command: 'policy.explain',
        tool: opts.tool,
        args: args as Record<string, unknown>,
        agent: opts.agent,
        ...(opts.file === undefined ? {} : { policy: readPolicyFile(opts.file) }),
      });
      if (opts.file !== undefined) out(`policy   ${opts.file} (not applied)`);
      out(`rule     ${r.rule ?? '(none matches: the default for this tool)'}`);
      out(`asks     ${r.asks}`);
      out(`version  ${r.version}`);
    });
}

function addUpstreamCommands(upstream: Command): void {
  upstream
    .command('list')
    .argument('[name]', 'one upstream (default: all)')
    .description("each upstream tool's pinned class, and any change held until accepted")
    .action(async (name: string | undefined) => {
      const { pins } = await runData(config(), { command: 'upstream.list', name });
      if (pins.length === 0) out('no upstream tools seen yet');
      for (const p of pins) printPin(p);
    });
  upstream
    .command('accept')
    .argument('<name>', 'the upstream')
    .argument('[tool]', 'one of its tools (default: every tool with a held change)')
    .description('re-pin tools to the less gated class their upstream now lists (audited)')
    .action(async (name: string, tool: string | undefined) => {
      const { accepted } = await runData(config(), {
        command: 'upstream.accept',
        name,
        tool,
        actor: cliActor(),
      });
      if (accepted.length === 0)
        out(`nothing to accept: no change of ${tool ? `${name} ${tool}` : name} is held`);
      for (const a of accepted) out(`${name}__${a.tool}: ${a.from} -> ${a.to} (accepted)`);
    });
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
