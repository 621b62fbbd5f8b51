import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { createHostRoots, pinRowMacs, readHostRoots, type HostRoots } from '../core/host-roots.ts';
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
  /** The audit log's head seq (audit's), to pin the first row that must carry a row MAC. */
  headSeq?: () => Promise<number>,
): Promise<OpenedRoots> {
  let roots = readHostRoots(file);
  if (!roots) {
    const origin = await recordedValue(knex, 'audit_origin');
    const tagKey = await recordedValue(knex, 'agent_token_tag_key');
    const hashes = (await tokenHashes?.()) ?? [];
    const made = createHostRoots(file, () => `countersign:${randomUUID()}`, {
      ...(origin !== undefined ? { origin } : {}),
      ...(tagKey !== undefined ? { agent_token_tag_key: tagKey } : {}),
      agent_token_hashes: hashes,
    });
    roots = made.roots;
    if (made.created) {
      const adopted = origin !== undefined;
      log?.warn(
        { file, origin: roots.origin, adopted_origin: adopted, adopted_tokens: hashes.length },
        adopted
          ? 'host roots created: the audit origin the database held is now pinned on the host'
          : 'host roots created',
      );
    }
  }
  if (roots.rowMacsFrom === undefined && headSeq) roots = pinFirstMacRow(roots, await headSeq(), log);
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
 * Pins, once, the first row that must carry a row MAC: the one after the head as it is now (before this
 * version appends anything). Rows before it were appended without MACs and are checked by their chain
 * and checkpoints only.
 */
function pinFirstMacRow(roots: HostRoots, head: number, log?: Logger): HostRoots {
  const pinned = pinRowMacs(roots.file, head + 1);
  log?.warn(
    { file: roots.file, seq: pinned.rowMacsFrom },
    'host roots: audit rows carry a row MAC from this seq',
  );
  return pinned;
}

/** openHostRoots once, when first asked (a command's process may never need the keys). */
export function lazyHostRoots(knex: Knex, file: string, log?: Logger): () => Promise<HostRoots> {
  let opened: Promise<HostRoots> | undefined;
  return () => {
    opened ??= openHostRoots(knex, file, log).then(
      (o) => o.roots,
      (err: unknown) => {
        opened = undefined;
        throw err;
      },
    );
    return opened;
  };
}
