import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The nearest directory at or above `dir` that holds package.json: the checkout countersign runs from. */
function packageRoot(dir: string): string {
  for (let d = dir; ; d = path.dirname(d)) {
    if (fs.existsSync(path.join(d, 'package.json'))) return d;
    if (path.dirname(d) === d) throw new Error(`no package.json above ${dir}`);
  }
}

/**
 * The checkout's root, whether this module runs from the TypeScript sources (src/core/) or bundled
 * into the build (dist/): the files read at run time — views, static files, profiles, migrations,
 * package.json — are found from here, never relative to the running module.
 */
export const ROOT = packageRoot(path.dirname(fileURLToPath(import.meta.url)));

/** Whether this process runs the build (`npm start`) rather than the sources through tsx. */
export const COMPILED = !fileURLToPath(import.meta.url).endsWith('.ts');
