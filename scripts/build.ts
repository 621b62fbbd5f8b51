/**
 * npm run build: the server as plain JavaScript in dist/, which `npm start` runs without tsx.
 *
 * Sources run through tsx everywhere else (tests, the CLI): no build step is needed to work on
 * countersign. The server is built because tsx's loader costs a running server about 60 MB and
 * almost a second of start-up (docs/performance.md). Templates, static files and profiles are read
 * from the checkout at run time (src/core/paths.ts); migrations are compiled file by file into
 * dist/migrations, keeping their names.
 */
import fs from 'node:fs';
import path from 'node:path';
import { build } from 'esbuild';
import { buildTemplate, TEMPLATES } from '../src/db/template.ts';
import { buildFingerprint, ROOT, STAMP } from './build-inputs.ts';

const common = { platform: 'node', format: 'esm', target: 'node20', logLevel: 'warning' } as const;
// `--out DIR` builds elsewhere (the tests' own copy, test/helpers/built.ts); dist/ by default.
const outAt = process.argv.indexOf('--out');
const OUT = outAt > 0 ? path.resolve(process.argv[outAt + 1]!) : path.join(ROOT, 'dist');
const where = path.relative(ROOT, OUT) || '.';

// `npm start` builds first: when nothing it is built from changed since the last build, that is a no-op
// (`--force` builds anyway).
const fingerprint = buildFingerprint();
const stampFile = path.join(OUT, STAMP);
const readStamp = () => (fs.existsSync(stampFile) ? fs.readFileSync(stampFile, 'utf8').trim() : undefined);
// The embedded database's template (src/db/template.ts) outlives a rebuild of the code: it changes only
// with PGlite's version and the list of migrations, and making it takes initdb's seconds. `--no-template`
// makes none (the tests' builds: a build run from elsewhere finds dist/'s, when it is current).
const templates = path.join(OUT, TEMPLATES);
/** Makes the template unless it is there; says how long that took. A failure costs speed, not the build. */
async function ensureTemplate(): Promise<string> {
  if (process.argv.includes('--no-template')) return '';
  const started = performance.now();
  try {
    const { file, made } = await buildTemplate(templates, path.join(ROOT, 'dist', TEMPLATES));
    const s = ((performance.now() - started) / 1000).toFixed(1);
    return made ? `; made the database template ${path.relative(ROOT, file)} in ${s} s` : '';
  } catch (err) {
    return `; no database template (${(err as Error).message}): a fresh data directory runs initdb and every migration`;
  }
}
if (!process.argv.includes('--force') && readStamp() === fingerprint) {
  process.stderr.write(
    `${where}/ is up to date with the sources (npm run build -- --force builds anyway)${await ensureTemplate()}\n`,
  );
  process.exit(0);
}

const keptTemplates = fs.existsSync(templates) ? fs.mkdtempSync(`${OUT}.templates-`) : undefined;
if (keptTemplates) fs.renameSync(templates, path.join(keptTemplates, TEMPLATES));
fs.rmSync(OUT, { recursive: true, force: true });
await build({
  ...common,
  entryPoints: [path.join(ROOT, 'src/cli.ts')],
  outdir: OUT,
  bundle: true,
  // Each command's modules stay their own chunk, loaded when the command runs (as from the sources).
  splitting: true,
  packages: 'external',
  sourcemap: true,
});
const migrations = fs.readdirSync(path.join(ROOT, 'migrations')).filter((f) => f.endsWith('.ts'));
await build({
  ...common,
  entryPoints: migrations.map((f) => path.join(ROOT, 'migrations', f)),
  outdir: path.join(OUT, 'migrations'),
  sourcemap: true,
});
if (keptTemplates) {
  fs.renameSync(path.join(keptTemplates, TEMPLATES), templates);
  fs.rmSync(keptTemplates, { recursive: true, force: true });
}
const template = await ensureTemplate();
// Written last, so that a build cut short is never taken for a whole one.
fs.writeFileSync(stampFile, `${fingerprint}\n`);
process.stderr.write(
  `built ${path.relative(ROOT, path.join(OUT, 'cli.js'))} and ${migrations.length} migrations${template}\n`,
);
