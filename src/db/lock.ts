import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { AppError, isAppError } from '../core/errors.ts';

/** Who holds a data directory: written into the lock file so a refused process can name the holder. */
export interface LockHolder {
  pid: number;
  hostname: string;
  command: string;
  started_at: string;
  /** Where it serves HTTP, once it does (noteServingUrl): a second start can point there. */
  url?: string;
}

/** The data directory is held by another live process: LOCKED, naming the holder and where it serves. */
export const dataDirLocked = (dir: string, holder: LockHolder) =>
  new AppError(
    'LOCKED',
    `the database in ${dir} is held by another countersign process ` +
      `(pid ${holder.pid} on ${holder.hostname}, "${holder.command}", since ${holder.started_at})` +
      (holder.url ? `, which serves it at ${holder.url}` : '') +
      ': the embedded database serves one process at a time. Use that one, or stop it first; ' +
      'give this one its own data directory (COUNTERSIGN_DATA_DIR); or, to run both on the same data, ' +
      'put it in PostgreSQL (countersign db copy --to URL, then DATABASE_URL=URL for each)',
    'data_dir_locked',
    { details: { dir, holder } },
  );

/** The process holding the data directory, when `err` is the refusal to take it. */
export const lockedBy = (err: unknown): LockHolder | undefined =>
  isAppError(err, 'LOCKED', 'data_dir_locked') ? (err.details?.holder as LockHolder) : undefined;

export interface DirLock {
  release(): void;
}

function readHolder(file: string): LockHolder | undefined {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as LockHolder;
  } catch {
    return undefined;
  }
}

/** Whether process `pid` on this host is gone (signal 0 finds no such process). */
export function processGone(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ESRCH';
  }
}

function isAlive(holder: LockHolder): boolean {
  if (holder.hostname !== os.hostname()) return true; // cannot tell: assume it is alive
  return !processGone(holder.pid);
}

/** Reads the current holder of `dir`'s lock, if a live process holds it. */
export function lockHolder(dir: string): LockHolder | undefined {
  const holder = readHolder(path.join(dir, 'countersign.lock'));
  return holder && isAlive(holder) ? holder : undefined;
}

/**
 * Adds the address this process serves at to the lock it holds on `dir`, so that a second start names
 * it. Replaced by rename, so a reader sees the old holder or the new one, never half of either.
 */
export function noteServingUrl(dir: string, url: string): void {
  const file = path.join(dir, 'countersign.lock');
  const holder = readHolder(file);
  if (holder?.pid !== process.pid) return; // not ours (PostgreSQL, or the lock was taken over)
  const tmp = `${file}.${process.pid}.url.tmp`;
  fs.writeFileSync(tmp, JSON.stringify({ ...holder, url }), { mode: 0o600 });
  fs.renameSync(tmp, file);
}

/**
 * Takes an exclusive lock on `dir` (PGlite does not lock its own data directory).
 * The lock file is created atomically by hard-linking a fully written temp file, so a reader never sees
 * a half-written holder. A lock left by a dead process on this host (a crash) is taken over, and
 * `onStale` told whose it was.
 */
export function lockDataDir(
  dir: string,
  command: string,
  onStale: (holder: LockHolder) => void = () => undefined,
): DirLock {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = path.join(dir, 'countersign.lock');
  const me: LockHolder = {
    pid: process.pid,
    hostname: os.hostname(),
    command,
    started_at: new Date().toISOString(),
  };
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, JSON.stringify(me), { mode: 0o600 });
  try {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        fs.linkSync(tmp, file);
        return {
          release() {
            if (readHolder(file)?.pid === process.pid) fs.rmSync(file, { force: true });
          },
        };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        const holder = readHolder(file);
        if (holder && isAlive(holder)) throw dataDirLocked(dir, holder);
        fs.rmSync(file, { force: true }); // stale: its process is gone
        if (holder) onStale(holder);
      }
    }
    throw new Error(`could not take the lock on ${dir}`);
  } finally {
    fs.rmSync(tmp, { force: true });
  }
}
