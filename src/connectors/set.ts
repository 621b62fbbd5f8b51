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

/** The directory entries whose names look like `name` (same UTS 39 skeleton). */
export type DirectoryLookalikes = (name: string) => Promise<{ target_id: string; display_name: string }[]>;

/**
 * `c` with the targets it resolves compared with the built-in directory: a bridge contact named to
 * imitate a directory entry comes back with that entry as its look-alike, as a local one does (the
 * local connector finds its own in the statement that resolves the target).
 */
function comparedWithDirectory(c: Connector, lookalikes: DirectoryLookalikes): Connector {
  return {
    ...c,
    async resolveTarget(type, ref) {
      const target = await c.resolveTarget(type, ref);
      if (!target.display_name || target.lookalikes?.length) return target;
      const found = (await lookalikes(target.display_name)).filter((l) => l.target_id !== target.target_id);
      return found.length ? { ...target, lookalikes: found } : target;
    },
  };
}

/**
 * The connectors, each call in a span when a tracer is given (tracing on); untouched otherwise. With
 * `directory`, targets of every connector but the local one are compared with the local directory.
 */
export function createConnectorSet(
  connectors: Record<string, Connector>,
  defaultName: string,
  tracer?: Tracer,
  directory?: DirectoryLookalikes,
): ConnectorSet {
  const compared = Object.fromEntries(
    Object.entries(connectors).map(([name, c]) => [
      name,
      directory && c.source !== 'local' ? comparedWithDirectory(c, directory) : c,
    ]),
  );
  const byName = tracer
    ? Object.fromEntries(
        Object.entries(compared).map(([name, c]) => [
          name,
          withSpans(c, tracer, CONNECTOR_SPANS, { 'countersign.connector.source': c.source }),
        ]),
      )
    : compared;
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
