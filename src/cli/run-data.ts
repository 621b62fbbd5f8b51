import fs from 'node:fs';
import path from 'node:path';
import v8 from 'node:v8';
import type { AdminCommand, AdminDeps, AdminResult } from '../admin/commands.ts';
import type { FirstRun } from '../admin/first-run.ts';
import { postgresProblem } from '../admin/pg-errors.ts';
import { publicBaseUrl, type Config } from '../config.ts';
import { AppError, isAppError } from '../core/errors.ts';
import { lockedBy, lockHolder } from '../db/lock.ts';
import { err, errFlushed } from './io.ts';

/**
 * Where a data command runs: in this process when the database can be opened, else through the
 * running server that holds the embedded one; and the first run's banner, which a command that makes
 * the database shows as `serve` does.
 */

/**
 * Commands that may run long in the embedded database (a whole log read or verified, a file loaded):
 * they keep V8's optimising compiler for PGlite's WebAssembly. Every other command runs a few
 * statements, for which that compiler's work is wasted: V8 compiles only with its baseline compiler
 * (Liftoff) for them, and a command such as `agent list` took 1.2 s of CPU and 192 MB instead of 1.7 s
 * and 268 MB (docs/performance.md, "8 December").
 */
const LONG_RUNNING = new Set<AdminCommand['command']>(['audit.export', 'audit.verify_db', 'import']);

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
  const { sendAdminCommand, UNREACHABLE } = await import('../admin/endpoint-client.ts');
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
export async function runData<C extends AdminCommand>(cfg: Config, command: C): Promise<AdminResult<C>> {
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
  // Set before PGlite's module is compiled, which is when it takes effect; this process serves nothing.
  if (!cfg.database_url && !LONG_RUNNING.has(command.command)) v8.setFlagsFromString('--liftoff-only');
  const { openDatabase } = await import('../db/knex.ts');
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
      import('../admin/commands.ts'),
      import('../app/admin-deps.ts'),
      import('../connectors/local/blobs.ts'),
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

/**
 * The first-run banner. Recorded as shown only once it has been written out: a start that dies before
 * that leaves the next start to make new credentials and show them.
 */
export async function showFirstRun(
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
export async function firstRunHere(deps: AdminDeps): Promise<void> {
  const { firstRun } = await import('../admin/first-run.ts');
  const first = await firstRun(deps);
  const web = publicBaseUrl(deps.config);
  await showFirstRun(first, {
    mcp: `start the server: countersign serve (HTTP, ${web}/mcp) or countersign serve --stdio`,
    web,
  });
}
