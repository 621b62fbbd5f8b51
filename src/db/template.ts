import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { PGlite } from '@electric-sql/pglite';
import knexFactory, { type Knex } from 'knex';
import { COMPILED, ROOT } from '../core/paths.ts';
import { MigrationSource, migrateLatest } from './migrations.ts';

/**
 * The embedded database's template: a PGlite data directory that has been through initdb and every
 * migration, and nothing else, dumped as a tarball by `npm run build`. A fresh data directory is
 * loaded from it (PGlite's `loadDataDir`) instead of running initdb and the migrations, which took
 * 5–22 s of a first start on a loaded machine against about 1 s (docs/operations.md, "A fresh data
 * directory").
 *
 * Its name is a digest of the PGlite version and the migrations' names, so a template made by
 * another PGlite or before a migration was added is never found; without one, a data directory is
 * made as before. It holds no identity: no row of any table, the host roots and the audit origin
 * being made at the first start, per data directory (src/db/host-roots.ts).
 */

/** Where templates are kept: beside the build that runs (`build --out`), then in the checkout's dist/. */
export const TEMPLATES = 'pglite-template';
const TEMPLATE_DIRS = [
  ...(COMPILED ? [path.join(path.dirname(fileURLToPath(import.meta.url)), TEMPLATES)] : []),
  path.join(ROOT, 'dist', TEMPLATES),
];

/**
 * knex-pglite's connection for an opened PGlite: a function, so that knex hands the instance over as
 * it is instead of deep-copying it (knex's types know only connection settings).
 */
export const pgliteConnection = (pglite: PGlite) =>
  (() => ({ pglite })) as unknown as Knex.Config['connection'];

/** The installed PGlite's version (its package.json, which its exports do not offer to import). */
export function pgliteVersion(): string {
  let dir = path.dirname(createRequire(import.meta.url).resolve('@electric-sql/pglite'));
  for (; !fs.existsSync(path.join(dir, 'package.json')); dir = path.dirname(dir)) {
    if (path.dirname(dir) === dir) throw new Error('no package.json above @electric-sql/pglite');
  }
  return (JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')) as { version: string }).version;
}

/** The template's file name for this PGlite and these migrations. */
export async function templateName(source = new MigrationSource()): Promise<string> {
  const names = (await source.getMigrations()).map((f) => source.getMigrationName(f));
  const digest = createHash('sha256')
    .update(`pglite ${pgliteVersion()}\n${names.join('\n')}\n`)
    .digest('hex')
    .slice(0, 16);
  return `pglite-${pgliteVersion()}-${names.length}-migrations-${digest}.tar.gz`;
}

/** The current template's path, when there is one. */
export async function findTemplate(dirs = TEMPLATE_DIRS): Promise<string | undefined> {
  const name = await templateName();
  return dirs.map((dir) => path.join(dir, name)).find((file) => fs.existsSync(file));
}

/**
 * PostgreSQL's settings for the embedded database, beside PGlite's own (single user, no fsync): a
 * buffer pool of 16 MB rather than PostgreSQL's 128 MB. A single-process server's working set (the
 * accounts, the approvals in flight, the audit log's newest pages) fits in it many times over, and
 * PGlite's WebAssembly memory touches the whole pool: a process with 128 MB of buffers had a resident
 * size of 308 MB after opening its database and 200 reads, with 16 MB 182 MB (docs/performance.md).
 */
export const PGLITE_SETTINGS = { shared_buffers: '16MB' } as const;

/** Opens the embedded database in `dataDir`, from `template` when it is fresh (what initdb and the migrations would make). */
export async function openPglite(dataDir: string, template?: string): Promise<PGlite> {
  const { PGlite } = await import('@electric-sql/pglite');
  const pglite = new PGlite(dataDir, {
    startParams: [
      ...PGlite.defaultStartParams,
      ...Object.entries(PGLITE_SETTINGS).flatMap(([name, value]) => ['-c', `${name}=${value}`]),
    ],
    ...(template ? { loadDataDir: new Blob([fs.readFileSync(template)]) } : {}),
  });
  await pglite.waitReady;
  return pglite;
}

/**
 * Makes the current template in `dir` (an in-memory PGlite, initdb, every migration, dumped gzipped),
 * unless it is there; removes templates for other versions. Written aside and renamed, so a build cut
 * short never leaves half a template. Returns its path.
 */
export async function buildTemplate(
  dir: string,
  copyFrom?: string,
): Promise<{ file: string; made: boolean }> {
  const name = await templateName();
  const file = path.join(dir, name);
  fs.mkdirSync(dir, { recursive: true });
  for (const other of fs.readdirSync(dir))
    if (other !== name) fs.rmSync(path.join(dir, other), { force: true });
  if (fs.existsSync(file)) return { file, made: false };
  const aside = `${file}.${process.pid}`;
  const ready = copyFrom && fs.existsSync(path.join(copyFrom, name));
  if (ready) {
    fs.copyFileSync(path.join(copyFrom, name), aside);
  } else {
    const { PGlite } = await import('@electric-sql/pglite');
    const { default: ClientPgLite } = await import('knex-pglite');
    const pglite = new PGlite();
    const knex = knexFactory({
      client: ClientPgLite,
      dialect: 'postgres',
      connection: pgliteConnection(pglite),
    });
    try {
      await migrateLatest(knex);
      const tarball = await pglite.dumpDataDir('gzip');
      fs.writeFileSync(aside, Buffer.from(await tarball.arrayBuffer()));
    } finally {
      await knex.destroy();
    }
  }
  fs.renameSync(aside, file);
  return { file, made: !ready };
}
