import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import canonicalize from 'canonicalize';
import { z } from 'zod';
import { Checkpoint, checkpointPayload } from '../checkpoints.ts';

/**
 * The witness directory: an append-only record of every checkpoint, on storage the database's
 * administrator does not control (another mount). countersign only ever creates files there, each once
 * (O_EXCL), never rewrites or deletes one: `<seq>-<id>.checkpoint.json` holds a signed checkpoint,
 * `<seq>-<id>.tsa.json` the same checkpoint with its RFC 3161 token. `<id>` is the first 16 hex characters
 * of the SHA-256 of the checkpoint's signed statement; `<seq>` is zero-padded so names sort by seq.
 */

export const WitnessFile = z.object({ checkpoint: Checkpoint, tsa_token: z.string().optional() });
export type WitnessFile = z.infer<typeof WitnessFile>;

export interface WitnessEntry extends WitnessFile {
  file: string;
}

/** The bytes a checkpoint's signature and its time-stamp cover. */
export const statementBytes = (cp: Checkpoint) => Buffer.from(canonicalize(checkpointPayload(cp))!);

const nameOf = (cp: Checkpoint, kind: 'checkpoint' | 'tsa') =>
  `${String(cp.seq).padStart(20, '0')}-${createHash('sha256').update(statementBytes(cp)).digest('hex').slice(0, 16)}.${kind}.json`;

/** Creates the file once; the same content already there is no error, other content never replaced. */
export function writeWitness(dir: string, entry: WitnessFile): string {
  const file = path.join(dir, nameOf(entry.checkpoint, entry.tsa_token ? 'tsa' : 'checkpoint'));
  const text = `${JSON.stringify(entry, null, 2)}\n`;
  try {
    fs.writeFileSync(file, text, { flag: 'wx', mode: 0o644 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    if (fs.readFileSync(file, 'utf8') !== text)
      throw new Error(`witness file ${file} exists with other content`, { cause: err });
  }
  return file;
}

/**
 * Every entry of a witness directory, by seq. A file that is not a witness entry is returned as a problem
 * rather than skipped: something wrote into a directory only countersign writes to.
 */
export function readWitness(dir: string): { entries: WitnessEntry[]; unreadable: string[] } {
  const entries: WitnessEntry[] = [];
  const unreadable: string[] = [];
  for (const name of fs.readdirSync(dir).sort()) {
    if (!/^\d{20}-[0-9a-f]{16}\.(checkpoint|tsa)\.json$/.test(name)) continue;
    try {
      const parsed = WitnessFile.parse(JSON.parse(fs.readFileSync(path.join(dir, name), 'utf8')));
      entries.push({ file: name, ...parsed });
    } catch {
      unreadable.push(name);
    }
  }
  return { entries, unreadable };
}

/** The newest checkpoint of `origin` in the directory (the highest seq), if any. */
export function latestWitnessed(dir: string, origin: string): Checkpoint | undefined {
  if (!fs.existsSync(dir)) return undefined;
  const names = fs
    .readdirSync(dir)
    .filter((n) => /^\d{20}-[0-9a-f]{16}\.(checkpoint|tsa)\.json$/.test(n))
    .sort()
    .reverse();
  for (const name of names) {
    let parsed;
    try {
      parsed = WitnessFile.safeParse(JSON.parse(fs.readFileSync(path.join(dir, name), 'utf8')));
    } catch {
      continue; // not JSON: the verifier names it; the newest readable entry still binds
    }
    if (parsed.success && parsed.data.checkpoint.origin === origin) return parsed.data.checkpoint;
  }
  return undefined;
}
