import pino, { type Logger } from 'pino';
import { sourceStack } from './core/stack.ts';

export type { Logger };

/** pino's error serializer, its stack naming the sources when the server runs built (core/stack.ts). */
export function serializeError(err: unknown) {
  const out = pino.stdSerializers.err(err as Error);
  if (out && typeof out.stack === 'string') out.stack = sourceStack(out.stack);
  return out;
}

/** JSON logs on stderr (stdout is the MCP channel under stdio). Secrets are redacted by path. */
export function createLogger(level: string): Logger {
  return pino(
    {
      level,
      base: { name: 'countersign' },
      serializers: { err: serializeError },
      redact: {
        paths: [
          'token',
          'password',
          '*.token',
          '*.password',
          'headers.authorization',
          'req.headers.authorization',
        ],
        censor: '[redacted]',
      },
    },
    pino.destination({ fd: 2, sync: false }),
  );
}
