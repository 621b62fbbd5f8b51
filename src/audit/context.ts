import fs from 'node:fs';
import path from 'node:path';
import { configError, type Config } from '../config.ts';
import type { Connection } from '../db/knex.ts';
import type { Logger } from '../log.ts';
import { createAnchorer } from './anchors/index.ts';
import { createSignedHeadGuard } from './signed-head.ts';
import { recordedValue } from '../db/settings.ts';
import { openHostRoots, type OpenedRoots } from '../db/host-roots.ts';
import { readHostRoots, type HostRoots } from '../core/host-roots.ts';
import {
  describeTail,
  trustOf,
  trustedIds,
  unanchoredTail,
  type CheckpointTrust,
  type UnanchoredTail,
} from './chain-checkpoints.ts';
import {
  listCheckpoints,
  checkpointSignatureValid,
  type Checkpoint,
  type CheckpointDeps,
} from './checkpoints.ts';
import type { AuditLog } from './log.ts';
import { keyIdOf, loadSigner } from './signing.ts';
import { headSeq } from './query.ts';
import { ChainVerifier, verifyDatabaseChain, type ChainReport, type RowMacCheck } from './verify.ts';

/**
 * What checkpoints and exports need: the log's origin (one per database), this instance's signer, the
 * guard of the last head it signed (kept in its data directory and the witness directory) and the
 * time-stamping authority, when one is configured.
 */
export async function checkpointDeps(
  knex: Connection,
  audit: AuditLog,
  config: Config,
  log?: Logger,
  opened?: OpenedRoots,
): Promise<CheckpointDeps> {
  const { roots, databaseOrigin } =
    opened ??
    (await openHostRoots(knex, config.secrets.host_roots_path, log, undefined, (q) => headSeq(q ?? knex)));
  // The log is the one the host pins, whatever the database says (a different value is TAMPERED).
  const origin = roots.origin;
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
    guard: createSignedHeadGuard({
      ...{ dataDir: config.data_dir, origin, databaseOrigin, witnessDir, log },
      appended: () => audit.appended(),
      rowMacs: rowMacCheck(roots),
    }),
    anchor: createAnchorer(knex, config.audit.anchors, log),
  };
}

/**
 * The public half of the configured signing key, when its file exists (never generated here): the key
 * to check with on a database no server has started on yet, so none recorded the cluster's key.
 */
function configuredPublicKey(config: Config): string | undefined {
  const file = config.audit.signing_key_path ?? path.join(config.data_dir, 'audit-signing-key.pem');
  return fs.existsSync(file) ? loadSigner(config.data_dir, file).public_key : undefined;
}

export interface DatabaseReport {
  ok: boolean;
  summary: string;
  chain: ChainReport;
  checkpoints: number;
  /** The rows no signed checkpoint covers yet, when there are any. */
  tail?: UnanchoredTail;
  /**
   * Where the key the checkpoints were checked with came from: given by the caller (pinned), the host's
   * own signing key file (pinned: only the host has it), or the database's record of it (not pinned:
   * whoever holds the database can replace it); none when there is no key at all.
   */
  key_source: KeySource;
}

export type KeySource = 'given' | 'host' | 'database' | 'none';

const KEY_SOURCE_LINES: Record<KeySource, string> = {
  given: 'checkpoints checked with the keys given (pinned)',
  host: "checkpoints checked with this host's signing key (pinned)",
  database:
    'checkpoints checked with the key the database records: NOT pinned (give --pubkey, or run on the host with its data directory)',
  none: 'no key to check checkpoints with',
};

/**
 * Verifies the live table: the chain; every checkpoint row in it against the chain before it (its
 * recorded head, its signature by the log's key); and every stored checkpoint against the row it
 * names, the key and the row that records it. The keys are `publicKeyPems` when given (several after a
 * rotation), else the one the cluster recorded when its first replica started (else, with `config`,
 * the configured key's). Reports the rows after the last signed checkpoint.
 */
export async function verifyDatabase(
  knex: Connection,
  publicKeyPems: readonly string[] = [],
  config?: Config,
): Promise<DatabaseReport> {
  // The host's own key and origin first: the database's record of either is only a fallback, since
  // whoever holds the database can replace it.
  const hostKey = publicKeyPems.length > 0 ? undefined : config && configuredPublicKey(config);
  const key =
    publicKeyPems.length > 0
      ? publicKeyPems
      : (hostKey ?? (await recordedValue(knex, 'audit_signing_public_key')));
  const keySource: KeySource =
    publicKeyPems.length > 0 ? 'given' : hostKey ? 'host' : key ? 'database' : 'none';
  const recordedOrigin = await recordedValue(knex, 'audit_origin');
  const roots = config && readHostRoots(config.secrets.host_roots_path);
  const pinned = roots?.origin;
  const origin = pinned ?? recordedOrigin;
  const trust = key ? trustOf(key, origin) : undefined;
  const stored = await listCheckpoints(knex);
  const verifier = new ChainVerifier(undefined, trust, roots ? rowMacCheck(roots) : undefined);
  // The stored checkpoints in seq order, met as the walk reaches the row each names and the row after.
  const bySeq = new Map<number, Checkpoint[]>();
  for (const cp of stored) bySeq.set(cp.seq, [...(bySeq.get(cp.seq) ?? []), cp]);
  let badCheckpoint: string | undefined;
  let anchored = 0;
  const named = new Map<number, Checkpoint>();
  const chain = await verifyDatabaseChain(knex, 5000, verifier, (row) => {
    const recordedAt = named.get(row.seq - 1);
    if (recordedAt && row.kind !== 'checkpoint') {
      badCheckpoint ??= `checkpoint at seq ${recordedAt.seq}: row ${row.seq}, which recorded it in the chain, was replaced`;
    }
    named.delete(row.seq - 1);
    for (const cp of bySeq.get(row.seq) ?? []) {
      const problem = storedProblem(cp, row.hash, trust);
      if (problem) badCheckpoint ??= `checkpoint at seq ${cp.seq}: ${problem}`;
      else anchored = Math.max(anchored, cp.seq);
      named.set(cp.seq, cp);
    }
  });
  if (!chain.first_bad) {
    // Rows deleted from the end: a stored checkpoint past the head, or one whose recording row is gone.
    const beyond = stored.filter((cp) => cp.seq > chain.head_seq).sort((a, b) => a.seq - b.seq)[0];
    const unrecorded = named.get(chain.head_seq);
    if (beyond) {
      badCheckpoint ??= `checkpoint at seq ${beyond.seq}: the chain ends at seq ${chain.head_seq} (rows were deleted)`;
    } else if (unrecorded) {
      badCheckpoint ??= `checkpoint at seq ${unrecorded.seq}: row ${unrecorded.seq + 1}, which recorded it in the chain, is missing (rows were deleted)`;
    }
  }
  if (pinned !== undefined && recordedOrigin !== undefined && recordedOrigin !== pinned) {
    badCheckpoint ??= `the database names the log ${recordedOrigin}, the host roots pin ${pinned}: the stored origin was changed`;
  }
  if (!trust && stored.length + (verifier.checkpoints?.count ?? 0) > 0) {
    badCheckpoint ??= 'no public key to check the checkpoints with: give --pubkey';
  }
  anchored = Math.max(anchored, verifier.checkpoints?.anchoredThrough ?? 0);
  const tail = chain.first_bad ? undefined : unanchoredTail(anchored, chain.head_seq);
  const ok = !chain.first_bad && !badCheckpoint;
  const inChain = verifier.checkpoints?.count ?? 0;
  const lines = [
    `${chain.valid}/${chain.rows} rows valid; ${stored.length} checkpoint${stored.length === 1 ? '' : 's'} ` +
      `${badCheckpoint ? 'NOT valid' : 'valid'}; ${inChain} recorded in the chain`,
  ];
  if (chain.first_bad)
    lines.push(
      `${isRowMacFault(chain.first_bad.fault) ? 'TAMPERED: ' : ''}first bad (seq ${chain.first_bad.seq}): ` +
        `${chain.first_bad.fault}: ${chain.first_bad.detail}`,
    );
  if (badCheckpoint) lines.push(badCheckpoint);
  if (tail) lines.push(describeTail(tail));
  lines.push(KEY_SOURCE_LINES[keySource]);
  const report = { ok, summary: lines.join('\n'), chain, checkpoints: stored.length, key_source: keySource };
  return tail ? { ...report, tail } : report;
}

const isRowMacFault = (fault: string) => fault === 'row_unsigned' || fault === 'row_mac_mismatch';

/** The host's row MAC check, from the seq its roots pin (none pinned yet: every row is older). */
export const rowMacCheck = (roots: HostRoots): RowMacCheck => ({
  from: roots.rowMacsFrom ?? Number.MAX_SAFE_INTEGER,
  verify: (hash, mac) => roots.verify('row', hash, mac),
});

/** What is wrong with a stored checkpoint, given the hash of the row it names; undefined when nothing. */
function storedProblem(
  cp: Checkpoint,
  rowHash: string,
  trust: CheckpointTrust | undefined,
): string | undefined {
  if (!trust) return undefined;
  const key = trust.keys.get(cp.key_id);
  if (key === undefined || keyIdOf(cp.public_key) !== cp.key_id) {
    return `signed by key ${cp.key_id}, not the log's key ${trustedIds(trust)}`;
  }
  if (trust.origin !== undefined && cp.origin !== trust.origin) return `of another log (${cp.origin})`;
  if (!checkpointSignatureValid(cp, key)) return 'bad signature';
  if (rowHash !== cp.head_hash) return 'the row there is not the signed head';
  return undefined;
}
