import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Knex } from 'knex';
import { COMPILED, ROOT } from '../core/paths.ts';

/**
 * The TypeScript migrations, or, when running a build, their compiled copies beside it (the bundle's
 * chunks and its migrations/ share one directory: dist/, or wherever `build --out` put them).
 */
const MIGRATIONS_DIR = COMPILED
  ? path.join(path.dirname(fileURLToPath(import.meta.url)), 'migrations')
  : path.join(ROOT, 'migrations');

/**
 * Lists `migrations/` by name without extension, so the names recorded in knex_migrations are the same
 * whether the sources run through tsx (.ts) or compiled (.js).
 */
export class MigrationSource implements Knex.MigrationSource<string> {
  constructor(private readonly dir = MIGRATIONS_DIR) {}

  async getMigrations(): Promise<string[]> {
    return fs
      .readdirSync(this.dir)
      .filter((f) => /\.(ts|js)$/.test(f) && !f.endsWith('.d.ts'))
      .sort();
  }

  getMigrationName(file: string): string {
    return file.replace(/\.(ts|js)$/, '');
  }

  async getMigration(file: string): Promise<Knex.Migration> {
    return (await import(pathToFileURL(path.join(this.dir, file)).href)) as Knex.Migration;
  }
}

/** Whether every migration in the directory is recorded as applied (no table yet: no). */
export async function upToDate(knex: Knex, source = new MigrationSource()): Promise<boolean> {
  const names = (await source.getMigrations()).map((f) => source.getMigrationName(f));
  try {
    const done = new Set(
      ((await knex('knex_migrations').select('name')) as { name: string }[]).map((r) =>
        r.name.replace(/\.(ts|js)$/, ''),
      ),
    );
    return names.every((n) => done.has(n));
  } catch {
    return false; // no knex_migrations table: a new database
  }
}

/**
 * Applies pending migrations; returns their names. A database that has them all — every start after
 * the first — is told so by one query, without importing each migration or taking knex's lock.
 */
export async function migrateLatest(knex: Knex): Promise<string[]> {
  if (await upToDate(knex, new MigrationSource())) return [];
  const [, applied] = (await knex.migrate.latest({ migrationSource: new MigrationSource() })) as [
    number,
    string[],
  ];
  return applied;
}
