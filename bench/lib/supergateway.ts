import { freePort, type GatewayProcess, packageBin, spawnGateway } from './gateway-process.ts';

export type Supergateway = GatewayProcess;

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
  const healthy = (url: string) =>
    fetch(url + HEALTH).then(
      (res) => res.ok,
      () => false,
    );
  return spawnGateway(
    'supergateway',
    packageBin('supergateway', 'supergateway'),
    args,
    port,
    healthy,
    timeoutMs,
  );
}
