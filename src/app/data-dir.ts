import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { configError } from '../config.ts';

/**
 * Start-up refuses a data directory it cannot write before anything else is opened: a container whose
 * volume is owned by another user, a read-only mount. Made when missing; then a file is created in it and
 * removed (a permission check alone says yes to root on a read-only mount).
 */
export function assertWritableDataDir(dir: string): void {
  // Named at random: replicas may share one data directory, and in containers each may be pid 1.
  const probe = path.join(dir, `.write-check-${randomBytes(8).toString('hex')}`);
  try {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    fs.writeFileSync(probe, '', { flag: 'wx', mode: 0o600 });
    fs.rmSync(probe);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    const who = process.getuid ? ` by this user (uid ${process.getuid()})` : '';
    throw configError(
      `the data directory ${dir} (data_dir, env COUNTERSIGN_DATA_DIR) is not writable${who}: ${code}. ` +
        'Make it writable by that user (a container volume: owned by the image user), or point data_dir elsewhere',
    );
  }
}
