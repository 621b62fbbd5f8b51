import type { Knex } from 'knex';
import { AppError } from '../core/errors.ts';
import { sharedValue } from '../db/settings.ts';

/**
 * All replicas sign checkpoints with one key: the first to start records its public key; a replica that
 * holds another key refuses to start, since two keys would sign one chain.
 */
export async function assertClusterSigningKey(knex: Knex, publicKey: string): Promise<void> {
  const recorded = await sharedValue(knex, 'audit_signing_public_key', () => publicKey);
  if (recorded.trim() !== publicKey.trim()) {
    throw new AppError(
      'CONFIG_INVALID',
      'this replica holds another audit signing key than the one the cluster records: give every replica ' +
        'the same key file with audit.signing_key_path (env COUNTERSIGN_AUDIT_SIGNING_KEY)',
      'signing_key_mismatch',
    );
  }
}
