import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import fs from 'node:fs';
import { configError, type Config } from '../config.ts';
import type { Logger } from '../log.ts';
import { createAnchorer } from './anchors/index.ts';
import { createSignedHeadGuard } from './signed-head.ts';
import { sharedValue } from '../db/settings.ts';
import { ChainHeadFromDb } from './chain.ts';
import { listCheckpoints, checkpointSignatureValid, type CheckpointDeps } from './checkpoints.ts';
import type { AuditLog } from './log.ts';
import { loadSigner } from './signing.ts';
import { verifyDatabaseChain } from './verify.ts';

/**
 * What checkpoints and exports need: the log's origin (one per database), this instance's signer, the
 * guard of the last head it signed (kept in its data directory and the witness directory) and the
 * time-stamping authority, when one is configured.
 */
export async function checkpointDeps(
  knex: Knex,
  audit: AuditLog,
  config: Config,
  log?: Logger,
): Promise<CheckpointDeps> {
  const origin = await sharedValue(knex, 'audit_origin', () => `countersign:${randomUUID()}`);
  const { witness_dir: witnessDir, tsa_cert_path: certPath } = config.audit.anchors;
  if (witnessDir) {
    try {
      fs.accessSync(witnessDir, fs.constants.W_OK);
    } catch (err) {
      throw configError(
        `audit.anchors.witness_dir: ${witnessDir} is not a writable directory (${(err as Error).message})`,
      );
    }
  }
  if (certPath && !fs.existsSync(certPath))
    throw configError(`audit.anchors.tsa_cert_path: ${certPath} does not exist`);
  return {
    knex,
    audit,
    origin,
    signer: loadSigner(config.data_dir, config.audit.signing_key_path),
    guard: createSignedHeadGuard({ dataDir: config.data_dir, origin, witnessDir, log }),
    anchor: createAnchorer(knex, config.audit.anchors, log),
  };
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
