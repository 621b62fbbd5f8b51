import fs from 'node:fs';

/** The package version, read once from package.json (two levels up from sources, three from dist/). */
function readVersion(): string {
  for (const rel of ['../../package.json', '../../../package.json']) {
    const url = new URL(rel, import.meta.url);
    if (fs.existsSync(url)) return (JSON.parse(fs.readFileSync(url, 'utf8')) as { version: string }).version;
  }
  return '0.0.0';
}

export const VERSION: string = readVersion();
