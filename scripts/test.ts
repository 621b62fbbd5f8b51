/**
 * npm test: Node's test runner, through tsx, over test files gathered into a few processes rather than
 * one process each.
 *
 *   node --import tsx scripts/test.ts [--groups N] [--test-…=VALUE …] PATH…
 *
 * Each PATH is a test file or a folder of them (`*.test.ts`). The files are dealt into N groups (8 by
 * default); each group is one entry file that imports its test files, so they run one after another in
 * one process. Node's own `--test-…` options go to its runner as given: `--test-concurrency=3` runs three
 * groups at a time, `--test-reporter=tap` (every npm script's) prints TAP, `--test-name-pattern=…`
 * picks tests. A test file run alone loaded the program through tsx first: 2.4–2.9 s of CPU before its
 * first test, a third of the whole suite's CPU on a 2-core machine (CONTRIBUTING.md, "Running tests").
 * Files that measure their own process run alone (scripts/test-groups.ts).
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { deal } from './test-groups.ts';

const ROOT = path.resolve(import.meta.dirname, '..');

interface Options {
  groups: number;
  paths: string[];
  /** Node's own test options (`--test-reporter=tap`, `--test-concurrency=3`, …), handed to it as given. */
  runner: string[];
}

function parse(argv: string[]): Options {
  const options: Options = { groups: 8, paths: [], runner: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--groups') {
      const n = Number(argv[++i]);
      if (!Number.isInteger(n) || n < 1) throw new Error('--groups takes a whole number ≥ 1');
      options.groups = n;
    } else if (arg.startsWith('--test-')) {
      if (!arg.includes('=')) throw new Error(`give ${arg} its value after "=" (${arg}=…)`);
      options.runner.push(arg);
    } else if (arg.startsWith('-')) throw new Error(`unknown option ${arg}`);
    else options.paths.push(arg);
  }
  if (options.paths.length === 0) throw new Error('name test files or folders of them');
  return options;
}

/** The test files a path names, relative to the checkout, sorted. */
function testFiles(at: string): string[] {
  const full = path.resolve(ROOT, at);
  if (!fs.existsSync(full)) throw new Error(`no such test file or folder: ${at}`);
  if (fs.statSync(full).isFile()) return [path.relative(ROOT, full)];
  const files = fs
    .readdirSync(full)
    .filter((f) => f.endsWith('.test.ts'))
    .sort()
    .map((f) => path.relative(ROOT, path.join(full, f)));
  // A folder that holds no test file is a mistake in the command, not a suite that passed.
  if (files.length === 0) throw new Error(`no *.test.ts file in ${at}`);
  return files;
}

async function main(): Promise<number> {
  const options = parse(process.argv.slice(2));
  const files = [...new Set(options.paths.flatMap(testFiles))];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-test-groups-'));
  try {
    const entries = deal(files, options.groups).map((group, i) => {
      const entry = path.join(dir, `group-${String(i + 1).padStart(2, '0')}.test.mjs`);
      const lines = group.map((f) => `import ${JSON.stringify(pathToFileURL(path.join(ROOT, f)).href)};`);
      fs.writeFileSync(entry, `// ${group.join(', ')}\n${lines.join('\n')}\n`);
      return entry;
    });
    const child = spawn(process.execPath, ['--import', 'tsx', '--test', ...options.runner, ...entries], {
      cwd: ROOT,
      stdio: 'inherit',
    });
    const forward = (signal: NodeJS.Signals) => child.kill(signal);
    process.on('SIGINT', forward).on('SIGTERM', forward);
    return await new Promise<number>((resolve) =>
      child.once('exit', (code, signal) => resolve(code ?? (signal ? 1 : 0))),
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

try {
  process.exitCode = await main();
} catch (err) {
  // A wrong command line: one line saying what, and nothing run.
  process.stderr.write(`scripts/test.ts: ${(err as Error).message}\n`);
  process.exitCode = 2;
}
