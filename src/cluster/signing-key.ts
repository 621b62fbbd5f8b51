import type { Knex } from 'knex';
import { sharedValue } from '../db/settings.ts';

export class SigningKeyMismatchError extends Error {
  override name = 'SigningKeyMismatchError';
}

/**
 * All replicas sign checkpoints with one key: the first to start records its public key; a replica that
 * holds another key refuses to start, since two keys would sign one chain.
 */
export async function assertClusterSigningKey(knex: Knex, publicKey: string): Promise<void> {
  const recorded = await sharedValue(knex, 'audit_signing_public_key', () => publicKey);
  if (recorded.trim() !== publicKey.trim()) {
    throw new SigningKeyMismatchError(
      'this replica holds another audit signing key than the one the cluster records: give every replica ' +
        'the same key file with audit.signing_key_path (env COUNTERSIGN_AUDIT_SIGNING_KEY)',
    );
  }
}
