import { randomUUID } from 'node:crypto';
import type { Connector, ConnectorSet } from '../../src/connectors/index.ts';
import { createConnectorSet } from '../../src/connectors/index.ts';
import type { ContactRecord } from '../../src/connectors/types.ts';
import { AppError } from '../../src/core/errors.ts';

/** A contact the connector twin knows: as the local directory imports one (connectors/local/import.ts). */
export interface TwinContact {
  id: string;
  display_name: string;
  account?: string | null;
  active?: boolean;
  external?: boolean;
}

/** A message the twin sent, with the key it was sent under. */
export interface SentMessage {
  ref: string;
  target_id: string;
  text: string;
  key: string;
}

/** What a test can look at and break in the connector twin. */
export interface TwinConnector extends Connector {
  readonly sent: readonly SentMessage[];
  /** The next sends fail with `err` (a connector outage, a TIMEOUT), until given undefined. */
  failSends(err: AppError | undefined): void;
}

const emptyPage = async () => ({ items: [], next: null });

/**
 * The local connector's twin in memory, for contacts: search, resolve (by id, else by name or account,
 * case-insensitive), send once per key, find a write by key. Groups, conversations, messages and files
 * are empty. A send passes the local connector's fence (connectors/local/send.ts): `executing` says
 * whether the approval its key names is executing; otherwise CONNECTOR_FAILED write_fenced.
 * test/twins/contracts/connectors.ts holds it to the local connector's answers.
 */
export function twinConnector(
  contacts: TwinContact[],
  executing: (key: string) => boolean,
  source = 'local',
): TwinConnector {
  const sent: SentMessage[] = [];
  let failing: AppError | undefined;
  const record = (c: TwinContact): ContactRecord => ({
    contact_id: c.id,
    display_name: c.display_name,
    account: c.account ?? null,
    department: null,
    title: null,
    active: c.active ?? true,
    confidence: 1,
    raw_ref: c.id,
  });
  return {
    source,
    sent,
    failSends(err) {
      failing = err;
    },
    async searchContacts(q) {
      const query = q.query.toLowerCase();
      const found = contacts
        .filter(
          (c) => (q.includeInactive || c.active !== false) && c.display_name.toLowerCase().includes(query),
        )
        .sort((a, b) => (a.id < b.id ? -1 : 1))
        .map(record);
      return { items: found.slice(0, q.limit), next: null };
    },
    searchGroups: emptyPage,
    getConversation: async () => undefined,
    findConversationsByName: async () => [],
    listMessages: emptyPage,
    listFiles: emptyPage,
    async resolveTarget(type, ref) {
      const byId = type === 'contact' ? contacts.filter((c) => c.id === ref) : [];
      const rows = byId.length
        ? byId
        : type === 'contact'
          ? contacts.filter((c) => c.display_name.toLowerCase() === ref.toLowerCase() || c.account === ref)
          : [];
      if (rows.length === 0)
        throw new AppError('TARGET_NOT_FOUND', `no ${type} "${ref}"`, `${type}_not_found`);
      if (rows.length > 1)
        throw new AppError(
          'AMBIGUOUS_TARGET',
          `${rows.length} ${type}s match "${ref}"; pass the id`,
          'several_matches',
          {
            details: { candidates: rows.map((r) => ({ target_id: r.id, display_name: r.display_name })) },
          },
        );
      const row = rows[0]!;
      if (row.active === false)
        throw new AppError('PERMISSION_DENIED', `contact ${row.id} is inactive`, 'contact_inactive');
      return {
        target_type: type,
        target_id: row.id,
        display_name: row.display_name,
        ...(row.external === undefined ? {} : { external: row.external }),
      };
    },
    async sendMessage({ target, text, key }) {
      if (failing) throw failing;
      if (!executing(key))
        throw new AppError(
          'CONNECTOR_FAILED',
          'the approval is no longer executing: nothing was written',
          'write_fenced',
        );
      const prior = sent.find((m) => m.key === key);
      if (prior) return { ref: prior.ref };
      const ref = `m_${randomUUID()}`;
      sent.push({ ref, target_id: target.target_id, text, key });
      return { ref };
    },
    async sendFile() {
      throw new AppError('SOURCE_UNAVAILABLE', 'the connector twin sends no files', 'not_in_twin');
    },
    async findWrite(key) {
      const prior = sent.find((m) => m.key === key);
      return prior ? { found: true, ref: prior.ref } : { found: false };
    },
    openFile: async () => undefined,
  };
}

/**
 * The connector set over twins: the real set's picking (connectors/set.ts, which holds no state of its
 * own) with the twin connectors behind it.
 */
export function twinConnectorSet(
  connectors: Record<string, Connector>,
  defaultName = Object.keys(connectors)[0]!,
): ConnectorSet {
  return createConnectorSet(connectors, defaultName);
}
