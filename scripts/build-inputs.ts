import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

export const ROOT = path.resolve(import.meta.dirname, '..');

/** What the build is made of: a change to any of these makes another build. */
export const INPUTS = [
  'src',
  'migrations',
  'scripts/build.ts',
  'scripts/build-inputs.ts',
  'package-lock.json',
];

/**
 * Every input file's path, size and modification time, sorted: the build's fingerprint. Reading
 * stat() of a few hundred files takes milliseconds, where hashing their contents would read them all;
 * a file touched without change only costs one build more.
 */
export function buildFingerprint(): string {
  const hash = createHash('sha256');
  const walk = (p: string) => {
    const stat = fs.statSync(p);
    if (stat.isDirectory()) for (const name of fs.readdirSync(p).sort()) walk(path.join(p, name));
    else hash.update(`${path.relative(ROOT, p)} ${stat.size} ${stat.mtimeMs}\n`);
  };
  for (const input of INPUTS) walk(path.join(ROOT, input));
  return hash.digest('hex').slice(0, 16);
}

/** The file in a build's directory that names the fingerprint it was built from. */
export const STAMP = '.built-from';
