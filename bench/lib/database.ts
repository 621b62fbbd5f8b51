import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { createBlobStore } from '../../src/connectors/local/blobs.ts';
import { demoData } from '../../src/connectors/local/demo.ts';
import { importData } from '../../src/connectors/local/import.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';
import { createAgent, storedTokenHashes } from '../../src/accounts/agents.ts';
import { HOST_ROOTS_FILE } from '../../src/config.ts';
import { lazyHostRoots } from '../../src/db/host-roots.ts';
import type { Knex } from 'knex';
import { createUser } from '../../src/accounts/users.ts';

export const DEFAULT_ADMIN_URL = 'postgres://postgres@127.0.0.1:5432/postgres';

export interface ScratchDatabase {
  url: string;
  name: string;
  drop(): Promise<void>;
}

async function admin<T>(adminUrl: string, run: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    return await run(client);
  } finally {
    await client.end();
  }
}

/** A fresh PostgreSQL database on the server of `adminUrl` (any database there), dropped by `drop()`. */
export async function createScratchDatabase(adminUrl: string, label: string): Promise<ScratchDatabase> {
  const name = `countersign_${label}_${randomBytes(4).toString('hex')}`;
  await admin(adminUrl, (c) => c.query(`create database ${name}`));
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    url: url.href,
    name,
    drop: () =>
      admin(adminUrl, (c) => c.query(`drop database if exists ${name} with (force)`)).then(() => {}),
  };
}

export async function postgresVersion(adminUrl: string): Promise<string> {
  return admin(adminUrl, async (c) => String((await c.query('show server_version')).rows[0].server_version));
}

/** Contacts beyond the demo directory, so a search scans a directory of realistic size. */
function extraContacts(n: number) {
  const first = ['Maria', 'Marek', 'Omar', 'Mara', 'Jon', 'Lea', 'Noa', 'Yusuf', 'Wei', 'Ana', 'Tomás'];
  const last = ['Marin', 'Okafor', 'Levi', 'Dubois', 'Chen', 'Silva', 'Novak', 'Haddad', 'Kim', 'Berg'];
  const depts = ['Legal', 'Finance', 'Operations', 'Sales', 'Research'];
  return Array.from({ length: n }, (_, i) => ({
    id: `ct_bench_${i}`,
    display_name: `${first[i % first.length]} ${last[Math.floor(i / first.length) % last.length]} ${i}`,
    account: `user${i}`,
    department: depts[i % depts.length],
    title: i % 7 === 0 ? 'Manager' : 'Analyst',
    active: i % 13 !== 0,
  }));
}

export interface Seeded {
  token: string;
  chair: { name: string; password: string };
}

/**
 * The host roots the servers on `dataDir` will read (its default file), opened for `knex`: agents
 * created through it get tokens those servers accept.
 */
export function seedHostRoots(knex: Knex, dataDir: string): void {
  lazyHostRoots(knex, `${dataDir}/${HOST_ROOTS_FILE}`, undefined, () => storedTokenHashes(knex));
}

/**
 * Migrates `url`, loads the demo directory plus `contacts` more, and creates one agent (rate limit off)
 * and one chair. Everything a benchmark or a drill needs before servers start.
 */
export async function seedDatabase(url: string, dataDir: string, contacts = 2000): Promise<Seeded> {
  const db = await openDatabase({ url, pgliteDir: '', command: 'bench seed' });
  try {
    await migrateLatest(db.knex);
    seedHostRoots(db.knex, dataDir);
    const blobs = createBlobStore(`${dataDir}/blobs`);
    const demo = demoData();
    await importData(db.knex, blobs, {
      ...demo,
      contacts: [...(demo.contacts ?? []), ...extraContacts(contacts)],
    });
    const { token } = await createAgent(db.knex, { name: 'bench', rate_limit_per_min: 100_000_000 });
    const chair = { name: 'bench-chair', password: 'bench chair password' };
    await createUser(db.knex, { name: chair.name, roles: ['chair'], password: chair.password });
    return { token, chair };
  } finally {
    await db.close();
  }
}
