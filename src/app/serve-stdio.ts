import { ProtocolError, ProtocolErrorCode } from '@modelcontextprotocol/server';
import { serveStdio as serveMcpStdio } from '@modelcontextprotocol/server/stdio';
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';
import type { AuthFailure } from '../accounts/agents.ts';
import { AppError } from '../core/errors.ts';
import { createMcpServer } from '../server/mcp.ts';
import { openServices } from './services.ts';
import { VERSION } from '../server/version.ts';

/**
 * Serves one agent over stdin/stdout. The agent is the holder of COUNTERSIGN_AGENT_TOKEN; the token is
 * checked again on every request, so revoking the agent takes effect at once.
 */
export async function serveStdio(config: Config, log: Logger, token: string | undefined) {
  const services = await openServices(config, log, 'countersign serve --stdio');
  const denied = (refused: { failure: AuthFailure; agent?: { id: string } }) =>
    services.audit.append({
      kind: 'auth.denied',
      agent_id: refused.agent?.id ?? null,
      result: 'error',
      error_code: 'UNAUTHENTICATED',
      details: { reason: refused.failure, transport: 'stdio' },
    });
  const first = await services.authenticate(token);
  if ('failure' in first) {
    await denied(first);
    await services.close();
    throw new AppError(
      'NOT_LOGGED_IN',
      `COUNTERSIGN_AGENT_TOKEN refused: ${first.failure.replace(/_/g, ' ')}`,
      first.failure,
    );
  }

  const handle = serveMcpStdio(
    () => {
      const server = createMcpServer({
        version: VERSION,
        pipeline: services.pipeline,
        async authorize() {
          const now = await services.authenticate(token);
          if ('failure' in now) {
            await denied(now);
            throw new ProtocolError(ProtocolErrorCode.InvalidRequest, `agent token refused: ${now.failure}`);
          }
          return now.agent;
        },
      });
      // Upstream tool lists change at run time: this connection's client is told to list again.
      const unsubscribe = services.pipeline.onListChanged(() => {
        server.sendToolListChanged().catch(() => undefined);
      });
      server.onclose = unsubscribe;
      return server;
    },
    { onerror: (err) => log.debug({ err: err.message }, 'stdio message refused') },
  );
  log.info({ agent: first.agent.name, database: services.db.dialect }, 'countersign serving on stdio');

  // The client closing stdin ends the connection: close once, whichever way the end is seen.
  return new Promise<void>((resolve) => {
    let stopping = false;
    const stop = async () => {
      if (stopping) return;
      stopping = true;
      await handle.close().catch(() => undefined);
      await services.close();
      resolve();
    };
    process.stdin.once('end', () => void stop());
    process.stdin.once('close', () => void stop());
  });
}
