import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { build as esbuild } from 'esbuild';
import path from 'node:path';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import type { CallToolResult } from '@modelcontextprotocol/client';
import { fetchUnwarned } from '../../src/core/fetch.ts';
import { sleep } from './stats.ts';

export const ROOT = path.resolve(import.meta.dirname, '../..');

export interface Child {
  child: ChildProcess;
  pid: number;
  url: string;
  stderr(): string;
  /** Resolves with the first match of `pattern` in stderr (now or later). */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<RegExpExecArray>;
  /** Resolves when the process has exited (for whatever reason). */
  exited: Promise<number | null>;
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/**
 * Starts a node process running `script` (through tsx, unless it is built JavaScript) and waits until its stderr shows a line matching
 * `ready` (with the URL in its first group). Output past the first 64 KiB is dropped.
 */
export function spawnNode(
  args: string[],
  env: Record<string, string>,
  ready: RegExp,
  opts: { timeoutMs?: number; nodeArgs?: string[] } = {},
): Promise<Child> {
  return new Promise((resolve, reject) => {
    const loader = args[0]?.endsWith('.ts') ? ['--import', 'tsx'] : [];
    const child = spawn(process.execPath, [...(opts.nodeArgs ?? []), ...loader, ...args], {
      cwd: ROOT,
      env: { PATH: process.env.PATH ?? '', ...env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    let started = false;
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${args.join(' ')} did not start in time: ${stderr.slice(-2000)}`));
    }, opts.timeoutMs ?? 60_000);
    child.stderr!.on('data', (chunk: Buffer) => {
      if (stderr.length < 65536) stderr += chunk.toString();
      if (started) return;
      const m = ready.exec(stderr);
      if (!m) return;
      started = true;
      clearTimeout(timer);
      resolve({
        child,
        pid: child.pid!,
        url: m[1]!,
        stderr: () => stderr,
        waitFor: (pattern, timeoutMs = 10_000) =>
          new Promise((found, fail) => {
            const check = () => {
              const m = pattern.exec(stderr);
              if (!m) return false;
              clearTimeout(timer);
              child.stderr!.off('data', check);
              found(m);
              return true;
            };
            const timer = setTimeout(() => {
              child.stderr!.off('data', check);
              fail(new Error(`no ${pattern} in: ${stderr.slice(-1000)}`));
            }, timeoutMs);
            if (!check()) child.stderr!.on('data', check);
          }),
        exited,
        stop: (signal = 'SIGTERM') => {
          if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
          child.kill(signal);
          return exited.then(() => {});
        },
      });
    });
    void exited.then((code) => {
      if (started) return;
      clearTimeout(timer);
      reject(new Error(`${args.join(' ')} exited with ${code} before it was ready: ${stderr.slice(-2000)}`));
    });
  });
}

let built: Promise<void> | undefined;

/**
 * `npm run build` once per process, and the bare baseline server built the same way into
 * dist/bench/: the servers measured run built JavaScript, as `npm start` does, both of them.
 */
export function buildOnce(): Promise<void> {
  built ??= new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts/build.ts')], {
      cwd: ROOT,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`build failed (${code})`))));
  }).then(async () => {
    await esbuild({
      entryPoints: [path.join(ROOT, 'bench/bare-server.ts')],
      outdir: path.join(ROOT, 'dist/bench'),
      ...{ bundle: true, packages: 'external', platform: 'node', format: 'esm', target: 'node20' },
      ...{ sourcemap: true, logLevel: 'warning' },
    });
  });
  return built;
}

/**
 * The bare baseline server (bench/bare-server.ts), built; resolves once it listens. Like countersign
 * under npm start, without --enable-source-maps (the dependencies' maps would cost it memory alone).
 */
export async function spawnBareServer(env: Record<string, string>): Promise<Child> {
  await buildOnce();
  return spawnNode([path.join(ROOT, 'dist/bench/bare-server.js')], env, /"url":"(http:\/\/[^"]+)\/mcp"/);
}

/** The node options of package.json's `npm start`: the benchmarks run the server exactly as it starts. */
export function startNodeArgs(): string[] {
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as {
    scripts: { start: string };
  };
  const words = pkg.scripts.start.split(/\s+/);
  if (words[0] !== 'node' || !words.includes('dist/cli.js'))
    throw new Error(`npm start is not "node [options] dist/cli.js serve": ${pkg.scripts.start}`);
  return words.slice(1, words.indexOf('dist/cli.js'));
}

/**
 * `countersign serve` on HTTP, as `npm start` runs it (the build, with its node options), as a child
 * process; resolves once it listens.
 * BENCH_SERVER_NODE_ARGS adds node options, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof" to profile it.
 */
export async function spawnCountersign(
  env: Record<string, string>,
  opts: { timeoutMs?: number; nodeArgs?: string[] } = {},
): Promise<Child> {
  await buildOnce();
  const extra = process.env.BENCH_SERVER_NODE_ARGS?.split(' ').filter(Boolean) ?? [];
  opts = { ...opts, nodeArgs: [...startNodeArgs(), ...extra, ...(opts.nodeArgs ?? [])] };
  return spawnNode(
    [path.join(ROOT, 'dist/cli.js'), 'serve'],
    {
      COUNTERSIGN_PORT: '0',
      COUNTERSIGN_RATE_LIMIT_PER_MIN: '100000000',
      COUNTERSIGN_DEMO: 'false',
      // info shows the listening line (start-up only: nothing is logged per call at this level).
      LOG_LEVEL: 'info',
      ...env,
    },
    /"url":"(http:\/\/[^"]+)\/mcp"/,
    opts,
  );
}

export async function connect(url: string, token?: string): Promise<Client> {
  const client = new Client({ name: 'countersign-bench', version: '1.0.0' });
  await client.connect(
    new StreamableHTTPClientTransport(new URL('/mcp', url), {
      requestInit: token ? { headers: { Authorization: `Bearer ${token}` } } : undefined,
      fetch: fetchUnwarned, // as countersign's own upstream clients: no leak warning per call under load
    }),
  );
  return client;
}

/** One tools/call; the envelope (structuredContent) and whether the SDK flagged an error. */
export async function callTool(
  client: Client,
  name: string,
  args: Record<string, unknown>,
  timeout = 60_000,
): Promise<{ envelope: Record<string, unknown>; isError: boolean }> {
  const result = (await client.callTool({ name, arguments: args }, { timeout })) as CallToolResult;
  return { envelope: (result.structuredContent ?? {}) as Record<string, unknown>, isError: !!result.isError };
}

/**
 * Calls `call` until it answers without a failure (its failure text, or undefined): countersign
 * connects to its upstreams in the background after start-up. Throws the last failure at the timeout.
 */
export async function untilAnswered(
  what: string,
  call: () => Promise<string | undefined>,
  timeoutMs = 30_000,
): Promise<void> {
  let failure: string | undefined;
  for (const until = Date.now() + timeoutMs; Date.now() < until; await sleep(200)) {
    failure = await call().catch((err: unknown) => String(err));
    if (!failure) return;
  }
  throw new Error(`${what} never answered the read: ${failure}`);
}
