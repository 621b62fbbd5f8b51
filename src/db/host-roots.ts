import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { AppError } from '../core/errors.ts';
import {
  createHostRoots,
  markPolicySealed,
  markRecordsSealed,
  pinRowMacs,
  readHostRoots,
  recordLegacyTokens,
  type HostRoots,
} from '../core/host-roots.ts';
import type { Logger } from '../log.ts';
import { recordedValue, sharedValue } from './settings.ts';

/** The host roots and the origin the database names (which differs from the pinned one only if changed). */
export interface OpenedRoots {
  roots: HostRoots;
  databaseOrigin: string;
}

/**
 * The host roots in `file`, made on the first start: a fresh install draws a new master key and origin;
 * an install an earlier version used adopts, once, the origin its database holds (the log keeps its
 * identity), its agent token tag key and the SHA-256 of its agents' tokens (docs/audit.md, "Host
 * roots"). From then on the database's origin is only compared with the pinned one: a database that
 * names no origin is given the pinned one; one that names another is reported (`databaseOrigin`), and
 * the signer refuses (TAMPERED, origin_mismatch).
 */
export async function openHostRoots(
  knex: Knex,
  file: string,
  log?: Logger,
  /** The stored hashes of the agent tokens in use (accounts'), pinned when the file is made. */
  tokenHashes?: () => Promise<string[]>,
  /**
   * The audit log's head seq (audit's), in `q` when given: to pin the first row that must carry a row
   * MAC, and what the seals made at an upgrade bind.
   */
  headSeq?: (q?: Knex | Knex.Transaction) => Promise<number>,
  /** Seals the users' and agents' records that have none, in `trx` (accounts'), once at the upgrade. */
  sealRecords?: SealRecords,
  /** Seals the stored approval policy if it has no seal, in `trx` (approval's), once at the upgrade. */
  sealPolicy?: SealPolicy,
): Promise<OpenedRoots> {
  let roots: HostRoots | undefined = readHostRoots(file);
  if (!roots) {
    const origin = await recordedValue(knex, 'audit_origin');
    const tagKey = await recordedValue(knex, 'agent_token_tag_key');
    const hashes = tokenHashes ? await tokenHashes() : undefined;
    const made = createHostRoots(file, () => `countersign:${randomUUID()}`, {
      ...(origin !== undefined ? { origin } : {}),
      ...(tagKey !== undefined ? { agent_token_tag_key: tagKey } : {}),
      ...(hashes ? { agent_token_hashes: hashes } : {}),
    });
    roots = made.roots;
    if (made.created) {
      const adopted = origin !== undefined;
      log?.warn(
        { file, origin: roots.origin, adopted_origin: adopted, adopted_tokens: hashes?.length },
        adopted
          ? 'host roots created: the audit origin the database held is now pinned on the host'
          : 'host roots created',
      );
    }
  }
  roots = await withLegacyTokens(knex, roots, tokenHashes, log);
  if (roots.rowMacsFrom === undefined && headSeq) roots = pinFirstMacRow(roots, await headSeq(), log);
  const head = headSeq ?? (async () => 0);
  if (!(roots.recordsSealed && roots.recordsFresh) && sealRecords)
    roots = await sealRecordsOnce(knex, roots, sealRecords, head, log);
  if (!(roots.policySealed && roots.policyFresh) && sealPolicy)
    roots = await sealPolicyOnce(knex, roots, sealPolicy, head, log);
  register(knex, roots);
  const databaseOrigin = await sharedValue(knex, 'audit_origin', () => roots.origin);
  if (databaseOrigin !== roots.origin) {
    log?.error(
      { pinned: roots.origin, database: databaseOrigin, file },
      "the database names another audit origin than the host's: not signing (TAMPERED)",
    );
  }
  return { roots, databaseOrigin };
}

/**
 * A roots file made before agent tokens were MACs records, at this start, the SHA-256 of the tokens
 * then stored (docs/identity.md, "Agent tokens"): those, and only those, are accepted as stored. A
 * file that cannot be rewritten (a read-only mounted secret) is left as it is: the tokens stored as a
 * SHA-256 are then refused (unknown_token) until rotated, which the error logged says.
 */
async function withLegacyTokens(
  knex: Knex,
  roots: HostRoots,
  tokenHashes: (() => Promise<string[]>) | undefined,
  log?: Logger,
): Promise<HostRoots> {
  if (roots.tokensRecorded || !tokenHashes) return roots;
  const hashes = await tokenHashes();
  const tagKey = await recordedValue(knex, 'agent_token_tag_key');
  try {
    const recorded = recordLegacyTokens(roots, hashes, tagKey);
    log?.warn(
      { file: roots.file, tokens: hashes.length },
      'host roots: agent tokens stored before MACs recorded',
    );
    return recorded;
  } catch (err) {
    log?.error(
      { file: roots.file, tokens: hashes.length, err: (err as Error).message },
      'host roots file cannot be rewritten: agent tokens stored before MACs are refused until rotated',
    );
    return roots;
  }
}

const registered = new WeakMap<object, () => Promise<HostRoots>>();
/** The first roots opened for a database stay its roots (a process opens one file). */
const register = (knex: Knex, roots: HostRoots) => {
  if (!registered.has(knex)) registered.set(knex, () => Promise.resolve(roots));
  const config = configOf(knex);
  if (config && !registered.has(config)) registered.set(config, () => Promise.resolve(roots));
};

/**
 * The configuration object a database's client was made with: shared by its transactions' clients, so
 * that a store handed a transaction (`changeUser(trx, …)`) reaches the same roots as its database.
 */
const configOf = (q: Knex | Knex.Transaction): object | undefined =>
  (q as unknown as { client?: { config?: object } }).client?.config;

/**
 * The host roots opened for `knex` (by openHostRoots, or lazily by lazyHostRoots): how the stores that
 * are handed only a database (an agent created with `createAgent(knex, …)`) reach the host's keys.
 * A database whose process opened no roots is refused (CONFIG_INVALID, host_roots_unopened).
 */
export function hostRootsOf(knex: Knex | Knex.Transaction): Promise<HostRoots> {
  const config = configOf(knex);
  const roots = registered.get(knex) ?? (config ? registered.get(config) : undefined);
  if (!roots)
    return Promise.reject(
      new AppError('CONFIG_INVALID', 'the host roots are not open for this database', 'host_roots_unopened'),
    );
  return roots();
}

/**
 * Pins, once, the first row that must carry a row MAC: the one after the head as it is now (before this
 * version appends anything). Rows before it were appended without MACs and are checked by their chain
 * and checkpoints only.
 */
function pinFirstMacRow(roots: HostRoots, head: number, log?: Logger): HostRoots {
  let pinned: HostRoots;
  try {
    pinned = pinRowMacs(roots.file, head + 1);
  } catch (err) {
    // A read-only mounted secret: `countersign migrate` where the file can be written pins it once.
    throw new AppError(
      'CONFIG_INVALID',
      `secrets.host_roots_path: ${roots.file} does not yet say from which row audit rows carry a MAC, ` +
        `and cannot be rewritten to say so (${(err as Error).message}): run \`countersign migrate\` ` +
        'once where the file is writable, then share it again (env COUNTERSIGN_HOST_ROOTS)',
      'host_roots_unpinned',
      { cause: err },
    );
  }
  log?.warn(
    { file: roots.file, seq: pinned.rowMacsFrom },
    'host roots: audit rows carry a row MAC from this seq',
  );
  return pinned;
}

export type SealRecords = (
  trx: Knex.Transaction,
  roots: HostRoots,
  head: number,
) => Promise<{ users: number; agents: number }>;

type HeadSeq = (q?: Knex | Knex.Transaction) => Promise<number>;

/**
 * Seals, once, the users' and agents' records that carry no seal (docs/identity.md, "Sealed records"),
 * and records in the roots file that it did so: the file is written before the transaction commits, so
 * a file that cannot be written (a read-only mounted secret) seals nothing and stops the start with the
 * way out (`countersign migrate` where it is writable). From then on an unsealed record is TAMPERED.
 */
async function sealRecordsOnce(
  knex: Knex,
  roots: HostRoots,
  sealRecords: SealRecords,
  head: HeadSeq,
  log?: Logger,
): Promise<HostRoots> {
  let marked: HostRoots | undefined;
  const sealed = await knex.transaction(async (trx) => {
    const counts = await sealRecords(trx, roots, await head(trx));
    try {
      marked = markRecordsSealed(roots.file);
    } catch (err) {
      throw new AppError(
        'CONFIG_INVALID',
        `secrets.host_roots_path: ${roots.file} does not yet say that the users' and agents' records are ` +
          `sealed, and cannot be rewritten to say so (${(err as Error).message}): run \`countersign migrate\` ` +
          'once where the file is writable, then share it again (env COUNTERSIGN_HOST_ROOTS)',
        'host_roots_unsealed',
        { cause: err },
      );
    }
    return counts;
  });
  log?.warn({ file: roots.file, ...sealed }, "host roots: the users' and agents' records are sealed");
  return marked!;
}

export type SealPolicy = (
  trx: Knex.Transaction,
  roots: HostRoots,
  head: number,
) => Promise<{ sealed: boolean }>;

/**
 * Seals, once, a stored approval policy that carries no seal (docs/policy.md, "The policy is sealed"),
 * and records in the roots file that it did so, as sealRecordsOnce: a file that cannot be written seals
 * nothing and stops the start. From then on a stored policy without its seal is TAMPERED.
 */
async function sealPolicyOnce(
  knex: Knex,
  roots: HostRoots,
  sealPolicy: SealPolicy,
  head: HeadSeq,
  log?: Logger,
): Promise<HostRoots> {
  let marked: HostRoots | undefined;
  const result = await knex.transaction(async (trx) => {
    const done = await sealPolicy(trx, roots, await head(trx));
    try {
      marked = markPolicySealed(roots.file);
    } catch (err) {
      throw new AppError(
        'CONFIG_INVALID',
        `secrets.host_roots_path: ${roots.file} does not yet say that the approval policy is sealed, and ` +
          `cannot be rewritten to say so (${(err as Error).message}): run \`countersign migrate\` once ` +
          'where the file is writable, then share it again (env COUNTERSIGN_HOST_ROOTS)',
        'host_roots_unsealed',
        { cause: err },
      );
    }
    return done;
  });
  log?.warn({ file: roots.file, ...result }, 'host roots: the stored approval policy is sealed');
  return marked!;
}

/** openHostRoots once, when first asked (a command's process may never need the keys). */
export function lazyHostRoots(
  knex: Knex,
  file: string,
  log?: Logger,
  tokenHashes?: () => Promise<string[]>,
  /** The audit head, to pin the first row that must carry a row MAC (as openHostRoots). */
  headSeq?: (q?: Knex | Knex.Transaction) => Promise<number>,
  sealRecords?: SealRecords,
  sealPolicy?: SealPolicy,
): () => Promise<HostRoots> {
  let opened: Promise<HostRoots> | undefined;
  const lazy = () => {
    opened ??= openHostRoots(knex, file, log, tokenHashes, headSeq, sealRecords, sealPolicy).then(
      (o) => o.roots,
      (err: unknown) => {
        opened = undefined;
        throw err;
      },
    );
    return opened;
  };
  if (!registered.has(knex)) registered.set(knex, lazy);
  const config = configOf(knex);
  if (config && !registered.has(config)) registered.set(config, lazy);
  return lazy;
}
