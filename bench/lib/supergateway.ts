import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { ROOT } from './server.ts';
import { sleep } from './stats.ts';

/** A port free right now on 127.0.0.1: supergateway prints the port it was given, not the one it got. */
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

/** supergateway's own bin (dist/index.js), as its package.json names it. */
function supergatewayBin(): string {
  const require = createRequire(path.join(ROOT, 'package.json'));
  const pkg = require.resolve('supergateway/package.json');
  const { bin } = require(pkg) as { bin: Record<string, string> };
  return path.join(path.dirname(pkg), bin.supergateway!);
}

export interface Supergateway {
  pid: number;
  /** Base URL; the MCP endpoint is `/mcp`. */
  url: string;
  stderr(): string;
  stop(): Promise<void>;
}

const HEALTH = '/healthz';

/**
 * supergateway in its stateful Streamable HTTP mode: one `stdioCommand` child (run through a shell,
 * as supergateway does) per MCP session. Its log is off (`--logLevel none`): at `info` it prints every
 * message it relays, work countersign does not do per call. Resolves once its health endpoint answers.
 */
export async function spawnSupergateway(stdioCommand: string, timeoutMs = 30_000): Promise<Supergateway> {
  const port = await freePort();
  const args = ['--stdio', stdioCommand, '--outputTransport', 'streamableHttp', '--stateful'];
  args.push('--port', String(port), '--logLevel', 'none', '--healthEndpoint', HEALTH);
  const child = spawn(process.execPath, [supergatewayBin(), ...args], {
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
    await exited; // its SIGTERM handler ends every session's child first
  };
  for (const until = Date.now() + timeoutMs; ;) {
    if (child.exitCode !== null) throw new Error(`supergateway exited with ${child.exitCode}: ${stderr}`);
    const up = await fetch(url + HEALTH).then(
      (res) => res.ok,
      () => false,
    );
    if (up) return { pid: child.pid!, url, stderr: () => stderr, stop };
    if (Date.now() > until) {
      await stop();
      throw new Error(`supergateway did not answer ${HEALTH} within ${timeoutMs} ms: ${stderr}`);
    }
    await sleep(100);
  }
}
