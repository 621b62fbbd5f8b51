#!/usr/bin/env node
// The `countersign` command. It runs the build (dist/, made by `npm run build`) when that is at least
// as new as every source file, which spares each command tsx's loader (about 60 MB and most of a second);
// otherwise it runs the TypeScript sources through tsx, so a checkout being worked on needs no build.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const root = path.resolve(import.meta.dirname, '..');
const built = path.join(root, 'dist', 'cli.js');

/** The newest modification time of any file under `dir`. */
function newest(dir) {
  let t = 0;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    t = Math.max(t, entry.isDirectory() ? newest(p) : fs.statSync(p).mtimeMs);
  }
  return t;
}

const fresh =
  fs.existsSync(built) &&
  fs.statSync(built).mtimeMs >=
    Math.max(newest(path.join(root, 'src')), newest(path.join(root, 'migrations')));
if (fresh) {
  process.setSourceMapsEnabled(true); // stack traces name the sources, as under tsx
  await import(pathToFileURL(built).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../src/cli.ts');
}
