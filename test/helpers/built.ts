import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { buildFingerprint, ROOT } from '../../scripts/build-inputs.ts';

let built: Promise<string> | undefined;

/**
 * The CLI as `npm start` runs it (plain JavaScript, no tsx loader): `node <path> ARGS`. A child process
 * of the build starts in half the time of one through tsx, with a third of its CPU. Built once for
 * the sources as they are, into node_modules/.cache/countersign-build/<fingerprint>/, which test files
 * running at the same time share: each builds into a directory of its own and renames it into place,
 * so that none ever runs a half-written build, and dist/ (npm start's, the benchmarks') is never touched.
 */
export function builtCli(): Promise<string> {
  built ??= (async () => {
    const cache = path.join(ROOT, 'node_modules/.cache/countersign-build');
    const dir = path.join(cache, buildFingerprint());
    const cli = path.join(dir, 'cli.js');
    if (fs.existsSync(cli)) return cli;
    const tmp = `${dir}.${process.pid}.tmp`;
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', 'scripts/build.ts', '--out', tmp, '--no-template'],
      {
        cwd: ROOT,
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    if (code !== 0) throw new Error(`the build failed (${code}): ${stderr}`);
    try {
      fs.renameSync(tmp, dir);
    } catch {
      // Another test file's build got there first: the same sources, so the same build.
      fs.rmSync(tmp, { recursive: true, force: true });
    }
    // Builds of sources as they were before stay behind: those more than a day old go (a test run
    // still using one, from before an edit, is never that old).
    for (const d of fs.readdirSync(cache)) {
      const at = path.join(cache, d);
      if (at !== dir && Date.now() - fs.statSync(at).mtimeMs > 24 * 3600_000)
        fs.rmSync(at, { recursive: true, force: true });
    }
    return cli;
  })();
  return built;
}

/**
 * An empty config file, given to every child process whose test names none: a countersign.config.json
 * that a developer keeps in the checkout (the children's working directory) never reaches a test.
 */
export function noConfigFile(): string {
  const file = path.join(os.tmpdir(), 'countersign-test-empty-config.json');
  if (!fs.existsSync(file)) fs.writeFileSync(file, '{}\n');
  return file;
}

/** A child's environment: PATH, the empty config unless the test names one, then the test's own. */
export const childEnv = (env: Record<string, string>): Record<string, string> => ({
  PATH: process.env.PATH ?? '',
  COUNTERSIGN_CONFIG: noConfigFile(),
  ...env,
});
