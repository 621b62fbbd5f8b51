import { z } from 'zod';
import { AppError } from '../core/errors.ts';
import type { Connector } from './types.ts';

/** `source_preference` values: the contract's, plus `local` (the built-in store). */
export const SourcePreference = z.enum(['auto', 'local', 'bridge', 'local_readonly', 'uia', 'network']);
export type SourcePreference = z.infer<typeof SourcePreference>;

export interface ConnectorSet {
  /** The connector for a preference; `auto` is the configured default. */
  pick(preference: SourcePreference): Connector;
}

export function createConnectorSet(byName: Record<string, Connector>, defaultName: string): ConnectorSet {
  return {
    pick(preference) {
      const name = preference === 'auto' ? defaultName : preference;
      const connector = byName[name];
      if (!connector) {
        throw new AppError(
          'SOURCE_UNAVAILABLE',
          `source "${preference}" is not configured on this server (configured: ${Object.keys(byName).join(', ')})`,
          'source_not_configured',
        );
      }
      return connector;
    },
  };
}
