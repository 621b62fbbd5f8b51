import { freePort, type GatewayProcess, packageBin, spawnGateway } from './gateway-process.ts';

export type McpProxy = GatewayProcess;

/**
 * mcp-proxy in front of `command` (no shell), serving Streamable HTTP only (`--server stream`) on
 * 127.0.0.1, stateful (its default: one child per MCP session). Resolves once its endpoint answers
 * HTTP at all (it has no health endpoint).
 */
export async function spawnMcpProxy(command: string[], timeoutMs = 30_000): Promise<McpProxy> {
  const port = await freePort();
  const args = ['--port', String(port), '--host', '127.0.0.1', '--server', 'stream', '--', ...command];
  const answers = (url: string) =>
    fetch(`${url}/mcp`, { method: 'GET' }).then(
      () => true,
      () => false,
    );
  return spawnGateway('mcp-proxy', packageBin('mcp-proxy', 'mcp-proxy'), args, port, answers, timeoutMs);
}
