import fs from 'node:fs';
import { AppError } from '../../core/errors.ts';
import type { Knex } from 'knex';
import type {
  ContactRecord,
  ConversationRecord,
  ConversationType,
  Connector,
  FileRecord,
  GroupRecord,
  MessageRecord,
  Page,
  WriteFence,
} from '../types.ts';
import type { BlobStore } from './blobs.ts';
import { likeContains, likePrefix, searchKey } from './keys.ts';
import { findLocalWrite, resolveLocalTarget, sendLocal } from './send.ts';

type Row = Record<string, unknown>;

const iso = (v: unknown): string | null =>
  v === null || v === undefined
    ? null
    : v instanceof Date
      ? v.toISOString()
      : new Date(String(v)).toISOString();

/** Rank of a directory match: exact name, name prefix, anywhere in name/account, elsewhere. */
const RANK_CONFIDENCE = [1, 0.9, 0.75, 0.5] as const;

function rankSql(knex: Knex, key: string) {
  return knex.raw(
    `case when name_key = ? then 0 when name_key like ? escape '\\' then 1
          when name_key like ? escape '\\' then 2 else 3 end`,
    [key, likePrefix(key), likeContains(key)],
  );
}

interface RankedPosition {
  r: number;
  n: string;
  id: string;
}

/** Keyset paging over (rank, name, id), with the C collation so the order is the same on every database. */
function pageRanked<T>(
  knex: Knex,
  base: Knex.QueryBuilder,
  key: string,
  limit: number,
  after: RankedPosition | undefined,
  toRecord: (row: Row, confidence: number) => T,
): Promise<Page<T>> {
  // rank is computed one level down so that the keyset condition can refer to it.
  const withRank = knex.from(base.as('b')).select('b.*', knex.raw('(?) as rank', [rankSql(knex, key)]));
  const ranked = knex
    .from(withRank.as('m'))
    .select('*')
    .orderByRaw('rank, display_name collate "C", id collate "C"')
    .limit(limit + 1);
  if (after)
    ranked.whereRaw('(rank, display_name collate "C", id collate "C") > (?, ?, ?)', [
      after.r,
      after.n,
      after.id,
    ]);
  return ranked.then((rows: Row[]) => {
    const items = rows.slice(0, limit);
    const last = items.at(-1);
    return {
      items: items.map((row) => toRecord(row, RANK_CONFIDENCE[Number(row.rank)] ?? 0.5)),
      next:
        rows.length > limit && last
          ? ({
              r: Number(last.rank),
              n: String(last.display_name),
              id: String(last.id),
            } satisfies RankedPosition)
          : null,
    };
  });
}

function fileRecord(row: Row): FileRecord {
  return {
    file_id: String(row.id),
    message_id: (row.message_id as string | null) ?? null,
    conversation_id: (row.conversation_id as string | null) ?? null,
    file_name: String(row.file_name),
    size_bytes: row.size_bytes === null ? null : Number(row.size_bytes),
    mime_type: (row.mime_type as string | null) ?? null,
    created_at: iso(row.created_at),
    download_ref: `local:file:${String(row.id)}`,
    sha256: String(row.sha256),
  };
}

/** The argument a connector method takes. */
type Query<M extends Exclude<keyof Connector, 'source'>> = Parameters<Connector[M]>[0];

/** Position after the last item of a page ordered newest first: (created_at, id). */
interface TimePosition {
  t: string | null;
  id: string;
}

function nextByTime(rows: Row[], items: Row[], limit: number): TimePosition | null {
  const last = items.at(-1);
  return rows.length > limit && last ? { t: iso(last.created_at), id: String(last.id) } : null;
}

function contactRecord(row: Row, confidence: number): ContactRecord {
  return {
    contact_id: String(row.id),
    display_name: String(row.display_name),
    account: (row.account as string | null) ?? null,
    department: (row.department as string | null) ?? null,
    title: (row.title as string | null) ?? null,
    active: Boolean(row.active),
    confidence,
    raw_ref: `local:contact:${String(row.id)}`,
  };
}

function groupRecord(row: Row, confidence: number): GroupRecord {
  return {
    group_id: String(row.id),
    display_name: String(row.display_name),
    member_count: Number(row.member_count),
    owner_ref: row.owner_contact_id ? `local:contact:${String(row.owner_contact_id)}` : null,
    archived: Boolean(row.archived),
    confidence,
    raw_ref: `local:group:${String(row.id)}`,
  };
}

function conversationRecord(row: Row): ConversationRecord {
  return {
    conversation_id: String(row.id),
    conversation_type: row.conversation_type as ConversationType,
    display_name: String(row.display_name),
  };
}

function messageRecord(row: Row, attachments: FileRecord[]): MessageRecord {
  return {
    message_id: String(row.id),
    conversation_id: String(row.conversation_id),
    sender_id: (row.sender_id as string | null) ?? null,
    sender_name: (row.sender_name as string | null) ?? null,
    content_type: row.content_type as MessageRecord['content_type'],
    content_text: String(row.content_text),
    attachments: attachments.map((f) => ({
      file_id: f.file_id,
      file_name: f.file_name,
      size_bytes: f.size_bytes,
      download_ref: f.download_ref,
    })),
    created_at: iso(row.created_at),
    received_at: iso(row.received_at),
    raw_ref: `local:message:${String(row.id)}`,
  };
}

function searchContacts(knex: Knex, { query, includeInactive, limit, after }: Query<'searchContacts'>) {
  const key = searchKey(query);
  const base = knex('contacts').where('search_key', 'like', likeContains(key));
  if (!includeInactive) base.where('active', true);
  return pageRanked(knex, base, key, limit, after as RankedPosition | undefined, contactRecord);
}

function searchGroups(knex: Knex, { query, includeArchived, limit, after }: Query<'searchGroups'>) {
  const key = searchKey(query);
  const base = knex('groups')
    .select(
      'groups.*',
      knex.raw('(select count(*) from group_members gm where gm.group_id = groups.id) as member_count'),
    )
    .where('name_key', 'like', likeContains(key));
  if (!includeArchived) base.where('archived', false);
  return pageRanked(knex, base, key, limit, after as RankedPosition | undefined, groupRecord);
}

/** The files attached to these messages, by message id. */
async function attachmentsOf(knex: Knex, messages: Row[]): Promise<Map<string, FileRecord[]>> {
  const attachments = new Map<string, FileRecord[]>();
  if (messages.length === 0) return attachments;
  const files = (await knex('files')
    .whereIn(
      'message_id',
      messages.map((r) => String(r.id)),
    )
    .orderBy('id')) as Row[];
  for (const f of files) {
    const list = attachments.get(String(f.message_id)) ?? [];
    list.push(fileRecord(f));
    attachments.set(String(f.message_id), list);
  }
  return attachments;
}

async function listMessages(knex: Knex, q: Query<'listMessages'>): Promise<Page<MessageRecord>> {
  const { conversationId, conversationType, keyword, since, includeAttachments, limit, after } = q;
  const query = knex('messages as m')
    .select('m.*')
    .orderBy([
      { column: 'm.created_at', order: 'desc' },
      { column: 'm.id', order: 'desc' },
    ])
    .limit(limit + 1);
  if (conversationId) query.where('m.conversation_id', conversationId);
  if (conversationType) {
    query
      .join('conversations as c', 'c.id', 'm.conversation_id')
      .where('c.conversation_type', conversationType);
  }
  if (keyword) query.where('m.text_key', 'like', likeContains(searchKey(keyword)));
  if (since) query.where('m.created_at', '>=', since);
  const pos = after as { t: string; id: string } | undefined;
  if (pos) query.whereRaw('(m.created_at, m.id) < (?::timestamptz, ?)', [pos.t, pos.id]);
  const rows = (await query) as Row[];
  const items = rows.slice(0, limit);
  const attachments = includeAttachments ? await attachmentsOf(knex, items) : new Map<string, FileRecord[]>();
  return {
    items: items.map((row) => messageRecord(row, attachments.get(String(row.id)) ?? [])),
    next: nextByTime(rows, items, limit),
  };
}

async function listFiles(knex: Knex, q: Query<'listFiles'>): Promise<Page<FileRecord>> {
  const { conversationId, messageId, fileId, limit, after } = q;
  const query = knex('files')
    .orderBy([
      { column: 'created_at', order: 'desc' },
      { column: 'id', order: 'desc' },
    ])
    .limit(limit + 1);
  if (conversationId) query.where('conversation_id', conversationId);
  if (messageId) query.where('message_id', messageId);
  if (fileId) query.where('id', fileId);
  const pos = after as { t: string; id: string } | undefined;
  if (pos) query.whereRaw('(created_at, id) < (?::timestamptz, ?)', [pos.t, pos.id]);
  const rows = (await query) as Row[];
  const items = rows.slice(0, limit);
  return { items: items.map(fileRecord), next: nextByTime(rows, items, limit) };
}

async function openFile(knex: Knex, blobs: BlobStore, fileId: string) {
  const row = (await knex('files').where({ id: fileId }).first()) as Row | undefined;
  if (!row) return undefined;
  const record = fileRecord(row);
  // The row names its bytes by their SHA-256, inside the blob store: a value that is not one names no
  // file of the store (a path written into the row by SQL), and is refused, never opened.
  const sha256 = String(row.sha256);
  if (!/^[0-9a-f]{64}$/.test(sha256))
    throw new AppError(
      'CONNECTOR_FAILED',
      `file ${fileId}: its record names no blob of the store`,
      'blob_name_invalid',
    );
  return { record, stream: fs.createReadStream(blobs.pathOf(sha256)) };
}

/** The built-in store: contacts, groups, conversations, messages and files in countersign's own database. */
export function createLocalConnector(knex: Knex, blobs: BlobStore, fence: WriteFence): Connector {
  return {
    source: 'local',
    searchContacts: (q) => searchContacts(knex, q),
    searchGroups: (q) => searchGroups(knex, q),
    async getConversation(id) {
      const row = (await knex('conversations').where({ id }).first()) as Row | undefined;
      return row && conversationRecord(row);
    },
    async findConversationsByName(name, type) {
      const q = knex('conversations').where('name_key', searchKey(name)).orderBy('id');
      if (type) q.where('conversation_type', type);
      return ((await q) as Row[]).map(conversationRecord);
    },
    listMessages: (q) => listMessages(knex, q),
    listFiles: (q) => listFiles(knex, q),
    resolveTarget: (type, ref) => resolveLocalTarget(knex, type, ref),
    sendMessage: async ({ target, text, key }) => ({
      ref: (await sendLocal(knex, { target, text, key }, fence)).ref,
    }),
    async sendFile({ target, file, caption, key }) {
      const sent = await sendLocal(knex, { target, text: caption ?? '', key, file }, fence);
      return { ref: sent.ref, file_ref: sent.file_ref! };
    },
    findWrite: (key) => findLocalWrite(knex, key),
    openFile: (fileId) => openFile(knex, blobs, fileId),
  };
}
