import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { ROOT } from './server.ts';
import { sleep } from './stats.ts';

/** A port free right now on 127.0.0.1 (a gateway told port 0 does not say which one it got). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** A package's own bin, as its package.json names it. */
export function packageBin(pkgName: string, binName: string): string {
  const require = createRequire(path.join(ROOT, 'package.json'));
  const pkg = require.resolve(`${pkgName}/package.json`);
  const { bin } = require(pkg) as { bin: Record<string, string> };
  return path.join(path.dirname(pkg), bin[binName]!);
}

/** A peer gateway the bench runs beside countersign. */
export interface GatewayProcess {
  pid: number;
  /** Base URL; the MCP endpoint is `/mcp`. */
  url: string;
  stderr(): string;
  stop(): Promise<void>;
}

/**
 * Runs `bin` with `args` under this node, with only PATH in its environment and its stderr kept (the
 * first 64 KiB), and resolves once `isUp(url)` says it answers; a gateway that exits or does not
 * answer within `timeoutMs` is a failure carrying its stderr. `name` is what the failures call it.
 */
export async function spawnGateway(
  name: string,
  bin: string,
  args: string[],
  port: number,
  isUp: (url: string) => Promise<boolean>,
  timeoutMs: number,
): Promise<GatewayProcess> {
  const child = spawn(process.execPath, [bin, ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '' },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => {
    if (stderr.length < 65536) stderr += chunk.toString();
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited; // a gateway's SIGTERM handler ends its sessions' children first
  };
  for (const until = Date.now() + timeoutMs; ; await sleep(100)) {
    if (child.exitCode !== null) throw new Error(`${name} exited with ${child.exitCode}: ${stderr}`);
    if (await isUp(url)) return { pid: child.pid!, url, stderr: () => stderr, stop };
    if (Date.now() > until) {
      await stop();
      throw new Error(`${name} did not answer within ${timeoutMs} ms: ${stderr}`);
    }
  }
}
