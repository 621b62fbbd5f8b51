import fs from 'node:fs';
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

/** The built-in store: contacts, groups, conversations, messages and files in countersign's own database. */
export function createLocalConnector(knex: Knex, blobs: BlobStore): Connector {
  return {
    source: 'local',

    searchContacts({ query, includeInactive, limit, after }) {
      const key = searchKey(query);
      const base = knex('contacts').where('search_key', 'like', likeContains(key));
      if (!includeInactive) base.where('active', true);
      return pageRanked(
        knex,
        base,
        key,
        limit,
        after as RankedPosition | undefined,
        (row, confidence) =>
          ({
            contact_id: String(row.id),
            display_name: String(row.display_name),
            account: (row.account as string | null) ?? null,
            department: (row.department as string | null) ?? null,
            title: (row.title as string | null) ?? null,
            active: Boolean(row.active),
            confidence,
            raw_ref: `local:contact:${String(row.id)}`,
          }) satisfies ContactRecord,
      );
    },

    searchGroups({ query, includeArchived, limit, after }) {
      const key = searchKey(query);
      const base = knex('groups')
        .select(
          'groups.*',
          knex.raw('(select count(*) from group_members gm where gm.group_id = groups.id) as member_count'),
        )
        .where('name_key', 'like', likeContains(key));
      if (!includeArchived) base.where('archived', false);
      return pageRanked(
        knex,
        base,
        key,
        limit,
        after as RankedPosition | undefined,
        (row, confidence) =>
          ({
            group_id: String(row.id),
            display_name: String(row.display_name),
            member_count: Number(row.member_count),
            owner_ref: row.owner_contact_id ? `local:contact:${String(row.owner_contact_id)}` : null,
            archived: Boolean(row.archived),
            confidence,
            raw_ref: `local:group:${String(row.id)}`,
          }) satisfies GroupRecord,
      );
    },

    async getConversation(id) {
      const row = (await knex('conversations').where({ id }).first()) as Row | undefined;
      return row && conversationRecord(row);
    },

    async findConversationsByName(name, type) {
      const q = knex('conversations').where('name_key', searchKey(name)).orderBy('id');
      if (type) q.where('conversation_type', type);
      return ((await q) as Row[]).map(conversationRecord);
    },

    async listMessages({
      conversationId,
      conversationType,
      keyword,
      since,
      includeAttachments,
      limit,
      after,
    }) {
      const q = knex('messages as m')
        .select('m.*')
        .orderBy([
          { column: 'm.created_at', order: 'desc' },
          { column: 'm.id', order: 'desc' },
        ])
        .limit(limit + 1);
      if (conversationId) q.where('m.conversation_id', conversationId);
      if (conversationType) {
        q.join('conversations as c', 'c.id', 'm.conversation_id').where(
          'c.conversation_type',
          conversationType,
        );
      }
      if (keyword) q.where('m.text_key', 'like', likeContains(searchKey(keyword)));
      if (since) q.where('m.created_at', '>=', since);
      const pos = after as { t: string; id: string } | undefined;
      if (pos) q.whereRaw('(m.created_at, m.id) < (?::timestamptz, ?)', [pos.t, pos.id]);
      const rows = (await q) as Row[];
      const items = rows.slice(0, limit);

      const attachments = new Map<string, FileRecord[]>();
      if (includeAttachments && items.length > 0) {
        const files = (await knex('files')
          .whereIn(
            'message_id',
            items.map((r) => String(r.id)),
          )
          .orderBy('id')) as Row[];
        for (const f of files) {
          const list = attachments.get(String(f.message_id)) ?? [];
          list.push(fileRecord(f));
          attachments.set(String(f.message_id), list);
        }
      }
      const last = items.at(-1);
      return {
        items: items.map((row): MessageRecord => ({
          message_id: String(row.id),
          conversation_id: String(row.conversation_id),
          sender_id: (row.sender_id as string | null) ?? null,
          sender_name: (row.sender_name as string | null) ?? null,
          content_type: row.content_type as MessageRecord['content_type'],
          content_text: String(row.content_text),
          attachments: (attachments.get(String(row.id)) ?? []).map((f) => ({
            file_id: f.file_id,
            file_name: f.file_name,
            size_bytes: f.size_bytes,
            download_ref: f.download_ref,
          })),
          created_at: iso(row.created_at),
          received_at: iso(row.received_at),
          raw_ref: `local:message:${String(row.id)}`,
        })),
        next: rows.length > limit && last ? { t: iso(last.created_at), id: String(last.id) } : null,
      };
    },

    async listFiles({ conversationId, messageId, fileId, limit, after }) {
      const q = knex('files')
        .orderBy([
          { column: 'created_at', order: 'desc' },
          { column: 'id', order: 'desc' },
        ])
        .limit(limit + 1);
      if (conversationId) q.where('conversation_id', conversationId);
      if (messageId) q.where('message_id', messageId);
      if (fileId) q.where('id', fileId);
      const pos = after as { t: string; id: string } | undefined;
      if (pos) q.whereRaw('(created_at, id) < (?::timestamptz, ?)', [pos.t, pos.id]);
      const rows = (await q) as Row[];
      const items = rows.slice(0, limit);
      const last = items.at(-1);
      return {
        items: items.map(fileRecord),
        next: rows.length > limit && last ? { t: iso(last.created_at), id: String(last.id) } : null,
      };
    },

    resolveTarget: (type, ref) => resolveLocalTarget(knex, type, ref),
    sendMessage: async ({ target, text, key }) => ({
      ref: (await sendLocal(knex, { target, text, key })).ref,
    }),
    async sendFile({ target, file, caption, key }) {
      const sent = await sendLocal(knex, { target, text: caption ?? '', key, file });
      return { ref: sent.ref, file_ref: sent.file_ref! };
    },
    findWrite: (key) => findLocalWrite(knex, key),

    async openFile(fileId) {
      const row = (await knex('files').where({ id: fileId }).first()) as Row | undefined;
      if (!row) return undefined;
      const record = fileRecord(row);
      return { record, stream: fs.createReadStream(blobs.pathOf(String(row.sha256))) };
    },
  };
}

function conversationRecord(row: Row): ConversationRecord {
  return {
    conversation_id: String(row.id),
    conversation_type: row.conversation_type as ConversationType,
    display_name: String(row.display_name),
  };
}
