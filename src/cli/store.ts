import path from 'node:path';
import type { Command } from 'commander';
import type { ImportSummary } from '../connectors/index.ts';
import { isAppError } from '../core/errors.ts';
import { config, out, readInput, usageError } from './io.ts';
import { runData } from './run-data.ts';

/** The database's commands: its schema, the local store's contents, and a move to PostgreSQL. */

function summary(imported: ImportSummary): string {
  return Object.entries(imported)
    .map(([k, v]) => `${v} ${k}`)
    .join(', ');
}

/** migrate, demo, import: the database's schema and the local store's contents. */
export function addStoreCommands(cli: Command): void {
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
      const text = readInput(file);
      const { imported } = await runData(config(), {
        command: 'import',
        file_name: path.basename(file),
        text,
      });
      out(`imported ${summary(imported)}`);
    });
}

/** db copy: the embedded database into an empty PostgreSQL database, verified there (docs/operations.md). */
export function addDbCommands(cli: Command): void {
  const db = cli.command('db').description('move the database: copy the embedded one into PostgreSQL');
  db.command('copy')
    .requiredOption('--to <url>', 'an empty PostgreSQL database: postgres://user:password@host:5432/name')
    .description('copy the embedded database into an empty PostgreSQL database and verify the copy')
    .action(async (opts: { to: string }) => {
      const { copyToPostgres, describeCopy, REFUSED } = await import('../admin/db-copy.ts');
      const cfg = config();
      try {
        for (const line of describeCopy(await copyToPostgres(cfg, opts.to), cfg)) out(line);
      } catch (e) {
        // A refused command line or target changed nothing: exit 2, like any usage error.
        throw isAppError(e, 'CONFIG_INVALID', REFUSED) ? usageError(e.message) : e;
      }
    });
}
