import type { Knex } from 'knex';
import { toCount } from '../db/knex.ts';
import type { BlobStore } from '../connectors/local/blobs.ts';
import { demoData } from '../connectors/local/demo.ts';
import { importData } from '../connectors/local/import.ts';
import { createAgent } from '../server/agents.ts';

/**
 * On the very first start (no agent has ever been created), seeds the demo directory when the store is
 * empty and creates the `demo` agent. Returns its token, to be shown once.
 */
export async function firstRun(knex: Knex, blobs: BlobStore): Promise<string | undefined> {
  const agents = toCount((await knex('agents').count({ n: '*' }).first())?.n);
  if (agents > 0) return undefined;
  const contacts = toCount((await knex('contacts').count({ n: '*' }).first())?.n);
  if (contacts === 0) await importData(knex, blobs, demoData());
  try {
    return (await createAgent(knex, { name: 'demo' })).token;
  } catch {
    return undefined; // another instance created it first
  }
}
