import { createPrivateKey, createPublicKey } from 'node:crypto';
import fs from 'node:fs';
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import type { FaultPoint } from '../../src/core/faults.ts';
import { builtCli, childEnv } from './built.ts';
import { ROOT } from './server.ts';

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `countersign ARGS` as a real child process (the build, as `npm start` runs it). */
export async function runCli(
  args: string[],
  env: Record<string, string>,
  opts: { input?: string; timeoutMs?: number } = {},
) {
  const cli = await builtCli();
  return new Promise<CliResult>((resolve, reject) => {
    const child = spawn(process.execPath, [cli, ...args], { cwd: ROOT, env: childEnv(env) });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`countersign ${args.join(' ')} did not finish in time; stderr: ${stderr}`));
    }, opts.timeoutMs ?? 60_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    child.stdin.end(opts.input ?? '');
  });
}

/** Starts `countersign serve` in a child process and waits until it listens; resolves with its URL. */
export async function spawnServer(
  env: Record<string, string>,
  opts: { crashAt?: FaultPoint } = {},
): Promise<{ child: ChildProcess; url: string; stderr: () => string }> {
  // With a fault to inject, the test's own entry point through tsx (the CLI never takes one); else the build.
  const entry = opts.crashAt
    ? ['--import', 'tsx', path.join(ROOT, 'test/helpers/faulty-server.ts')]
    : [await builtCli(), 'serve'];
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, entry, {
      cwd: ROOT,
      env: {
        ...childEnv(env),
        LOG_LEVEL: 'info',
        ...(opts.crashAt ? { TEST_CRASH_AT: opts.crashAt } : {}),
      },
    });
    let stderr = '';
    const timer = setTimeout(() => reject(new Error(`server did not start: ${stderr}`)), 60_000);
    child.stderr.on('data', (c: Buffer) => {
      stderr += c.toString();
      const m = /"url":"(http:\/\/[^"]+)\/mcp"/.exec(stderr);
      if (m) {
        clearTimeout(timer);
        resolve({ child, url: m[1]!, stderr: () => stderr });
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}: ${stderr}`));
    });
  });
}

export function stopChild(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

/**
 * `--pubkey FILE` for the signing key of the data directory in `env` (its public half, written beside
 * it): how a verifier pins the key it trusts instead of taking the one an export's manifest names.
 */
export function pinArgs(env: Record<string, string>): string[] {
  const dataDir = env.COUNTERSIGN_DATA_DIR!;
  const file = path.join(dataDir, 'audit-public-key.pem');
  const key = env.COUNTERSIGN_AUDIT_SIGNING_KEY ?? path.join(dataDir, 'audit-signing-key.pem');
  fs.writeFileSync(
    file,
    createPublicKey(createPrivateKey(fs.readFileSync(key))).export({ format: 'pem', type: 'spki' }),
  );
  return ['--pubkey', file];
}
