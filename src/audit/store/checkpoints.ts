import type { Queryable, Transaction } from '../../db/knex.ts';
import { AUDIT_LOCK_KEY } from './chain.ts';

/* The signed checkpoints (audit_checkpoints), and the chain's lock their signing takes. */

/** The newest stored checkpoint's row, undefined when none was made. */
export async function latest(knex: Queryable): Promise<unknown> {
  return (await knex('audit_checkpoints').orderBy('id', 'desc').first()) as unknown;
}

/** Every stored checkpoint's row, oldest first. */
export async function list(knex: Queryable): Promise<unknown> {
  return (await knex('audit_checkpoints').orderBy('id')) as unknown;
}

/** Stores a signed checkpoint. */
export async function insert(trx: Transaction, checkpoint: Record<string, unknown>): Promise<void> {
  await trx('audit_checkpoints').insert(checkpoint);
}

/** Takes the chain's advisory lock in `trx` (the lock every append takes: store/chain.ts). */
export async function lockChain(trx: Transaction): Promise<void> {
  await trx.raw('select pg_advisory_xact_lock(?)', [AUDIT_LOCK_KEY]);
}
