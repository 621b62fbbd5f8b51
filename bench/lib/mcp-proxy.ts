import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { ROOT } from './server.ts';
import { sleep } from './stats.ts';
import { freePort } from './supergateway.ts';

/** mcp-proxy's own bin, as its package.json names it. */
function mcpProxyBin(): string {
  const require = createRequire(path.join(ROOT, 'package.json'));
  const pkg = require.resolve('mcp-proxy/package.json');
  const { bin } = require(pkg) as { bin: Record<string, string> };
  return path.join(path.dirname(pkg), bin['mcp-proxy']!);
}

export interface McpProxy {
  pid: number;
  /** Base URL; the MCP endpoint is `/mcp`. */
  url: string;
  stderr(): string;
  stop(): Promise<void>;
}

/**
 * mcp-proxy in front of `command` (no shell), serving Streamable HTTP only (`--server stream`) on
 * 127.0.0.1, stateful (its default: one child per MCP session). Resolves once its endpoint answers
 * HTTP at all (it has no health endpoint).
 */
export async function spawnMcpProxy(command: string[], timeoutMs = 30_000): Promise<McpProxy> {
  const port = await freePort();
  const args = ['--port', String(port), '--host', '127.0.0.1', '--server', 'stream', '--', ...command];
  const child = spawn(process.execPath, [mcpProxyBin(), ...args], {
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
    await exited;
  };
  for (const until = Date.now() + timeoutMs; ; await sleep(100)) {
    if (child.exitCode !== null) throw new Error(`mcp-proxy exited with ${child.exitCode}: ${stderr}`);
    const up = await fetch(`${url}/mcp`, { method: 'GET' }).then(
      () => true,
      () => false,
    );
    if (up) return { pid: child.pid!, url, stderr: () => stderr, stop };
    if (Date.now() > until) {
      await stop();
      throw new Error(`mcp-proxy did not answer within ${timeoutMs} ms: ${stderr}`);
    }
  }
}
