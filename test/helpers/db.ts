import { storedTokenHashes } from '../../src/accounts/agents.ts';
import { lazyHostRoots } from '../../src/db/host-roots.ts';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import pg from 'pg';
import { openDatabase, type Database } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';

export type DbKind = 'pglite' | 'postgres';

/** A fresh test database, opened and migrated, for suites that use the modules without a server. */
export async function openMigratedDatabase(kind: DbKind): Promise<{ testDb: TestDatabase; db: Database }> {
  const testDb = await createTestDatabase(kind);
  const db = await openDatabase({
    url: testDb.url,
    pgliteDir: path.join(testDb.dataDir, 'pglite'),
    command: 'test',
  });
  await migrateLatest(db.knex);
  // The host roots the test's server shares (testEnv), opened when a store first needs its keys.
  const roots = path.join(testDb.dataDir, 'host-roots.json');
  lazyHostRoots(db.knex, roots, undefined, () => storedTokenHashes(db.knex));
  return { testDb, db };
}

const NEEDS_POSTGRES = 'needs PostgreSQL: set TEST_DATABASE_URL';
const CI_NEEDS_POSTGRES = 'CI=true but TEST_DATABASE_URL is not set: PostgreSQL must be tested';

/**
 * The databases every integration suite runs on: PGlite always; PostgreSQL when TEST_DATABASE_URL is set.
 * Under CI=true a missing TEST_DATABASE_URL is a failure, not a skip.
 */
export function databaseKinds(): DbKind[] {
  if (process.env.TEST_DATABASE_URL) return ['pglite', 'postgres'];
  if (process.env.CI === 'true') throw new Error(CI_NEEDS_POSTGRES);
  return ['pglite'];
}

/**
 * A suite only PostgreSQL can run (several processes on one database, a connection cut by a proxy).
 * Without TEST_DATABASE_URL it is one skipped test that says why, so a local run shows what did not
 * run instead of passing in silence; under CI=true, which always sets it, that test fails instead.
 */
export function describeOnPostgres(name: string, suite: () => void): void {
  if (process.env.TEST_DATABASE_URL) describe(name, suite);
  else if (process.env.CI === 'true') it(name, () => assert.fail(CI_NEEDS_POSTGRES));
  else it(name, { skip: NEEDS_POSTGRES }, () => {});
}

/** One test only PostgreSQL can run, inside a suite that runs anywhere; skipped or failed as above. */
export function itOnPostgres(name: string, test: () => Promise<void>): void {
  if (process.env.TEST_DATABASE_URL) it(name, test);
  else if (process.env.CI === 'true') it(name, () => assert.fail(CI_NEEDS_POSTGRES));
  else it(name, { skip: NEEDS_POSTGRES }, () => {});
}

/**
 * Where test databases live: in memory (/dev/shm) when it has room, else the temporary directory.
 * Each PGlite test database is a 40 MB copy of the template, removed when its suite ends: on this
 * shared VM's disk a test server's start and stop (startTestServer, then stop) took 2.8–5.3 s, most of
 * it copying and unlinking those files; in /dev/shm 1.0–1.6 s (load average 11–13, 7 December).
 * COUNTERSIGN_TEST_TMPDIR chooses another place.
 */
function testTmp(): string {
  if (process.env.COUNTERSIGN_TEST_TMPDIR) return process.env.COUNTERSIGN_TEST_TMPDIR;
  try {
    const { bavail, bsize } = fs.statfsSync('/dev/shm');
    fs.accessSync('/dev/shm', fs.constants.W_OK);
    // A container's /dev/shm is often 64 MB: room for a few databases would fail a suite half-way.
    if (bavail * bsize >= 4 * 1024 ** 3) return '/dev/shm';
  } catch {
    // no /dev/shm (macOS, Windows)
  }
  return os.tmpdir();
}
const TEST_TMP = testTmp();

const MIGRATIONS = new URL('../../migrations/', import.meta.url);

function migrationsDigest(): string {
  const hash = createHash('sha256');
  for (const f of fs.readdirSync(MIGRATIONS).sort()) {
    hash.update(f).update(fs.readFileSync(new URL(f, MIGRATIONS)));
  }
  return hash.digest('hex').slice(0, 16);
}

/**
 * A migrated PGlite data dir shared by all test files (creating one takes seconds; copying one, a moment).
 * Built aside and renamed into place, so parallel test files never see a half-built template. Opened as
 * any fresh data directory is: from dist/'s template when `npm run build` made a current one
 * (src/db/template.ts), else by initdb and every migration.
 */
async function pgliteTemplate(): Promise<string> {
  const dir = path.join(TEST_TMP, `countersign-pglite-template-${migrationsDigest()}`);
  if (fs.existsSync(path.join(dir, 'PG_VERSION'))) return dir;
  const building = `${dir}.${process.pid}.${randomBytes(4).toString('hex')}`;
  const db = await openDatabase({ pgliteDir: building, command: 'test template' });
  await migrateLatest(db.knex);
  await db.close();
  try {
    fs.renameSync(building, dir);
  } catch {
    fs.rmSync(building, { recursive: true, force: true }); // another file built it first
  }
  return dir;
}

export interface TestDatabase {
  kind: DbKind;
  /** Data dir for this test (holds pglite/ for the embedded database, blobs, downloads). */
  dataDir: string;
  /** Set for PostgreSQL. */
  url?: string;
  drop(): Promise<void>;
}

/** A fresh database for one test suite: a copy of the PGlite template, or a new PostgreSQL database. */
export async function createTestDatabase(kind: DbKind): Promise<TestDatabase> {
  const dataDir = fs.mkdtempSync(path.join(TEST_TMP, 'countersign-test-'));
  if (kind === 'pglite') {
    fs.cpSync(await pgliteTemplate(), path.join(dataDir, 'pglite'), { recursive: true });
    return { kind, dataDir, drop: async () => fs.rmSync(dataDir, { recursive: true, force: true }) };
  }
  const admin = new URL(process.env.TEST_DATABASE_URL!);
  const name = `countersign_test_${randomBytes(6).toString('hex')}`;
  const client = new pg.Client({ connectionString: admin.href });
  await client.connect();
  await client.query(`create database ${name}`);
  await client.end();
  const url = new URL(admin.href);
  url.pathname = `/${name}`;
  return {
    kind,
    dataDir,
    url: url.href,
    async drop() {
      const c = new pg.Client({ connectionString: admin.href });
      await c.connect();
      await c.query(`drop database if exists ${name} with (force)`);
      await c.end();
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
