import pino, { type Logger } from 'pino';

export type { Logger };

/** JSON logs on stderr (stdout is the MCP channel under stdio). Secrets are redacted by path. */
export function createLogger(level: string): Logger {
  return pino(
    {
      level,
      base: { name: 'countersign' },
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
