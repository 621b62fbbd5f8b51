import type { Config } from '../../config.ts';
import type { Tracer } from '../../core/tracing.ts';
import { VERSION } from '../../core/version.ts';
import { tracesUrl } from '../../server/index.ts';
import { defineService, type Closers } from './parts.ts';

export const tracing = defineService({
  name: 'tracing',
  needs: ['config'],
  provides: ['tracer'],
  open: async ({ config }, closers) => ({ tracer: await openTracing(config, closers) }),
});

/**
 * OpenTelemetry traces, only when an OTLP endpoint is configured: otherwise the SDK is not even loaded.
 * Closed (buffered spans exported) after everything else but the database.
 */
async function openTracing(config: Config, closers: Closers): Promise<Tracer | undefined> {
  const url = tracesUrl(config.tracing);
  if (!url) return undefined;
  const { startTracing } = await import('../../server/otel.ts');
  const tracing = startTracing({ url, version: VERSION });
  closers.push(() => tracing.shutdown());
  return tracing;
}
