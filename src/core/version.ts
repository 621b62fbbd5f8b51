import fs from 'node:fs';
import path from 'node:path';
import { ROOT } from './paths.ts';

/** The package version, read once from package.json. */
function readVersion(): string {
  const file = path.join(ROOT, 'package.json');
  return (JSON.parse(fs.readFileSync(file, 'utf8')) as { version: string }).version;
}

export const VERSION: string = readVersion();
