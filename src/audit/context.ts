import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import type { Config } from '../config.ts';
import { sharedValue } from '../db/settings.ts';
import { ChainHeadFromDb } from './chain.ts';
import { listCheckpoints, checkpointSignatureValid, type CheckpointDeps } from './checkpoints.ts';
import type { AuditLog } from './log.ts';
import { loadSigner } from './signing.ts';
import { verifyDatabaseChain } from './verify.ts';

/** What checkpoints and exports need: the log's origin (one per database) and this instance's signer. */
export async function checkpointDeps(knex: Knex, audit: AuditLog, config: Config): Promise<CheckpointDeps> {
  const origin = await sharedValue(knex, 'audit_origin', () => `countersign:${randomUUID()}`);
  return { knex, audit, origin, signer: loadSigner(config.data_dir, config.audit.signing_key_path) };
}

/** Verifies the live table: the chain, and every checkpoint against the row it names and its signature. */
export async function verifyDatabase(knex: Knex) {
  const chain = await verifyDatabaseChain(knex);
  const checkpoints = await listCheckpoints(knex);
  let badCheckpoint: string | undefined;
  for (const cp of checkpoints) {
    const row = ChainHeadFromDb.optional().parse(
      await knex('audit_events').where('seq', cp.seq).select('seq', 'hash').first(),
    );
    if (!checkpointSignatureValid(cp)) badCheckpoint ??= `checkpoint at seq ${cp.seq}: bad signature`;
    else if (row?.hash !== cp.head_hash)
      badCheckpoint ??= `checkpoint at seq ${cp.seq}: the row there is not the signed head`;
  }
  const ok = !chain.first_bad && !badCheckpoint;
  const lines = [
    `${chain.valid}/${chain.rows} rows valid; ${checkpoints.length} checkpoint${checkpoints.length === 1 ? '' : 's'} ${badCheckpoint ? 'NOT valid' : 'valid'}`,
  ];
  if (chain.first_bad)
    lines.push(`first bad (seq ${chain.first_bad.seq}): ${chain.first_bad.fault}: ${chain.first_bad.detail}`);
  if (badCheckpoint) lines.push(badCheckpoint);
  return { ok, summary: lines.join('\n'), chain, checkpoints: checkpoints.length };
}
