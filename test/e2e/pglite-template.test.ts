import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import knexFactory from 'knex';
import { openHostRoots } from '../../src/db/host-roots.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { MigrationSource, upToDate } from '../../src/db/migrations.ts';
import {
  buildTemplate,
  findTemplate,
  pgliteConnection,
  openPglite,
  PGLITE_SETTINGS,
} from '../../src/db/template.ts';
import type { Logger } from '../../src/log.ts';
import { ROOT } from '../helpers/server.ts';

/**
 * A fresh embedded database is loaded from the build's template instead of running initdb and the
 * migrations (docs/operations.md, "A fresh data directory"). The template is shared by every install
 * of a build, so it must carry nothing that is one installation's own.
 */
describe('the embedded database template', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cs-template-'));
  let template: string;
  before(async () => {
    // dist/'s when it is current (npm run build made it), else made here.
    template = (await buildTemplate(path.join(dir, 'templates'), path.join(ROOT, 'dist', 'pglite-template')))
      .file;
  });
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  const opened = async (name: string) => {
    const pglite = await openPglite(path.join(dir, name), template);
    const { default: ClientPgLite } = await import('knex-pglite');
    const knex = knexFactory({
      client: ClientPgLite,
      dialect: 'postgres',
      connection: pgliteConnection(pglite),
    });
    // Taken now: knex closes PGlite only if it took the connection, and an open one keeps the process alive.
    await knex.raw('select 1');
    return knex;
  };

  it('holds every migration and not one row of any other table', async () => {
    const knex = await opened('rows');
    try {
      assert.equal(await upToDate(knex), true);
      const source = new MigrationSource();
      const names = (await source.getMigrations()).map((f) => source.getMigrationName(f));
      const applied = (
        (await knex('knex_migrations').orderBy('id').select('name')) as { name: string }[]
      ).map((r) => r.name.replace(/\.(ts|js)$/, ''));
      assert.deepEqual(applied, names);
      const tables = (
        (await knex.raw(
          "select tablename from pg_tables where schemaname = 'public' and tablename not like 'knex_migrations%'",
        )) as { rows: { tablename: string }[] }
      ).rows.map((r) => r.tablename);
      assert.ok(
        tables.includes('server_secrets') && tables.includes('settings') && tables.includes('audit_events'),
      );
      for (const table of tables) {
        const [{ n }] = (await knex(table).count('* as n')) as [{ n: unknown }];
        assert.equal(Number(n), 0, `${table} is empty in the template`);
      }
    } finally {
      await knex.destroy();
    }
  });

  it('gives each data directory made from it its own host roots and audit origin', async () => {
    const origins: string[] = [];
    const keys: string[] = [];
    for (const name of ['one', 'two']) {
      const knex = await opened(name);
      try {
        const { roots, databaseOrigin } = await openHostRoots(
          knex,
          path.join(dir, `${name}-host-roots.json`),
        );
        assert.equal(databaseOrigin, roots.origin, 'the database takes the origin made for it');
        origins.push(roots.origin);
        keys.push(
          JSON.stringify(JSON.parse(fs.readFileSync(path.join(dir, `${name}-host-roots.json`), 'utf8'))),
        );
      } finally {
        await knex.destroy();
      }
    }
    assert.notEqual(origins[0], origins[1]);
    assert.notEqual(keys[0], keys[1]);
  });

  it('leaves a normal PGlite data directory, which opens as any other', async () => {
    const knex = await opened('plain');
    await knex.destroy();
    assert.ok(fs.existsSync(path.join(dir, 'plain', 'PG_VERSION')));
    const db = await openDatabase({ pgliteDir: path.join(dir, 'plain'), command: 'test' });
    try {
      assert.equal(await upToDate(db.knex), true);
      // Opened with the embedded database's own settings, whichever way it was made.
      for (const [name, value] of Object.entries(PGLITE_SETTINGS)) {
        const { rows } = (await db.knex.raw(`select current_setting('${name}') as v`)) as {
          rows: { v: string }[];
        };
        assert.equal(rows[0]!.v, value, name);
      }
    } finally {
      await db.close();
    }
  });

  it('is what openDatabase loads a fresh data directory from, when the build made one', async (t) => {
    if (!(await findTemplate())) return t.skip('no current template in dist/ (npm run build makes it)');
    const said: string[] = [];
    const log = {
      debug: (_: unknown, msg: string) => said.push(msg),
      warn() {},
      error() {},
    } as unknown as Logger;
    const db = await openDatabase({ pgliteDir: path.join(dir, 'opened'), command: 'test', log });
    try {
      assert.ok(said.includes('the embedded database loaded from its template'), said.join('; '));
      assert.equal(await upToDate(db.knex), true);
    } finally {
      await db.close();
    }
  });
});
