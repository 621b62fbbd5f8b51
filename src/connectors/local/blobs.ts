import { createHash, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

/** Content-addressed file bytes under `<data dir>/blobs/ab/abcdef…`. */
export interface BlobStore {
  put(bytes: Buffer): Promise<{ sha256: string; size: number }>;
  pathOf(sha256: string): string;
  /**
   * The bytes stored under `sha256`, checked against it: undefined when there are none, when the name is
   * not a SHA-256 (a value read back from the database names no other file), or when the bytes no longer
   * hash to it.
   */
  read(sha256: string): Promise<Buffer | undefined>;
}

export function createBlobStore(dir: string): BlobStore {
  const pathOf = (sha256: string) => {
    if (!/^[0-9a-f]{64}$/.test(sha256)) throw new Error(`not a sha256: ${sha256}`);
    return path.join(dir, sha256.slice(0, 2), sha256);
  };
  return {
    pathOf,
    async read(sha256) {
      if (!/^[0-9a-f]{64}$/.test(sha256)) return undefined;
      const bytes = await fs.promises.readFile(pathOf(sha256)).catch(() => undefined);
      return bytes && createHash('sha256').update(bytes).digest('hex') === sha256 ? bytes : undefined;
    },
    async put(bytes) {
      const sha256 = createHash('sha256').update(bytes).digest('hex');
      const target = pathOf(sha256);
      if (!fs.existsSync(target)) {
        await fs.promises.mkdir(path.dirname(target), { recursive: true });
        // Write aside, then rename: a reader never sees a partial blob.
        const tmp = `${target}.${randomUUID()}.tmp`;
        await fs.promises.writeFile(tmp, bytes, { flag: 'wx' });
        await fs.promises.rename(tmp, target);
      }
      return { sha256, size: bytes.length };
    },
  };
}
