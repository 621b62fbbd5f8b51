import { z } from 'zod';
import { AppError } from '../core/errors.ts';
import { withSpans, type Tracer } from '../core/tracing.ts';
import type { Connector } from './types.ts';

/** `source_preference` values: the contract's, plus `local` (the built-in store). */
export const SourcePreference = z.enum(['auto', 'local', 'bridge', 'local_readonly', 'uia', 'network']);
export type SourcePreference = z.infer<typeof SourcePreference>;

export interface ConnectorSet {
  /** The connector for a preference; `auto` is the configured default. */
  pick(preference: SourcePreference): Connector;
}

/** A span per connector call, `connector.<method>`: the time spent in the store, the bridge or the messenger. */
const CONNECTOR_SPANS = {
  searchContacts: 'connector.searchContacts',
  searchGroups: 'connector.searchGroups',
  getConversation: 'connector.getConversation',
  findConversationsByName: 'connector.findConversationsByName',
  listMessages: 'connector.listMessages',
  listFiles: 'connector.listFiles',
  resolveTarget: 'connector.resolveTarget',
  sendMessage: 'connector.sendMessage',
  sendFile: 'connector.sendFile',
  findWrite: 'connector.findWrite',
  openFile: 'connector.openFile',
} satisfies Record<Exclude<keyof Connector, 'source'>, string>;

/** The connectors, each call in a span when a tracer is given (tracing on); untouched otherwise. */
export function createConnectorSet(
  connectors: Record<string, Connector>,
  defaultName: string,
  tracer?: Tracer,
): ConnectorSet {
  const byName = tracer
    ? Object.fromEntries(
        Object.entries(connectors).map(([name, c]) => [
          name,
          withSpans(c, tracer, CONNECTOR_SPANS, { 'countersign.connector.source': c.source }),
        ]),
      )
    : connectors;
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
