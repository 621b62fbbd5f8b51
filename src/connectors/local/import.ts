import { createHash } from 'node:crypto';
import { parse as parseCsv } from 'csv-parse/sync';
import type { Knex } from 'knex';
import { AppError } from '../../core/errors.ts';
import { z } from 'zod';
import type { BlobStore } from './blobs.ts';
import { skeletonOf } from '../../core/visible.ts';
import { searchKey } from './keys.ts';

const Id = z.string().min(1).max(256);
const Time = z.iso.datetime({ offset: true });

/** The import format (JSON). Every section is optional; rows are upserted by id. */
export const ImportData = z.strictObject({
  contacts: z
    .array(
      z.strictObject({
        id: Id,
        display_name: z.string().min(1),
        account: z.string().nullish(),
        department: z.string().nullish(),
        title: z.string().nullish(),
        active: z.boolean().default(true),
        /** Outside the organisation (approval rules: target.external); omitted: not known, counted as outside. */
        external: z.boolean().nullish(),
      }),
    )
    .default([]),
  groups: z
    .array(
      z.strictObject({
        id: Id,
        display_name: z.string().min(1),
        owner_contact_id: Id.nullish(),
        archived: z.boolean().default(false),
        members: z.array(Id).default([]),
      }),
    )
    .default([]),
  conversations: z
    .array(
      z.strictObject({
        id: Id,
        conversation_type: z.enum(['direct', 'group', 'system']),
        display_name: z.string().min(1),
        contact_id: Id.nullish(),
        group_id: Id.nullish(),
      }),
    )
    .default([]),
  messages: z
    .array(
      z.strictObject({
        id: Id,
        conversation_id: Id,
        direction: z.enum(['incoming', 'outgoing']).default('incoming'),
        sender_id: Id.nullish(),
        sender_name: z.string().nullish(),
        content_type: z.enum(['text', 'image', 'file', 'rich', 'notify', 'unknown']).default('text'),
        content_text: z.string().default(''),
        created_at: Time,
        received_at: Time.nullish(),
      }),
    )
    .default([]),
  files: z
    .array(
      z.strictObject({
        id: Id,
        message_id: Id.nullish(),
        conversation_id: Id.nullish(),
        file_name: z.string().min(1),
        mime_type: z.string().nullish(),
        /** The file's bytes, base64. */
        content_base64: z.base64(),
        created_at: Time.optional(),
      }),
    )
    .default([]),
});
export type ImportData = z.input<typeof ImportData>;

export interface ImportSummary {
  contacts: number;
  groups: number;
  conversations: number;
  messages: number;
  files: number;
}

/** The columns of a contacts CSV: `id` and `display_name` required, the rest optional. */
export const CSV_COLUMNS = ['id', 'display_name', 'account', 'department', 'title', 'active'] as const;

/** A CSV whose header is not ours is refused whole, with the header we expect (csv-parse's `columns` callback). */
function checkedHeader(fileName: string) {
  return (header: string[]): string[] => {
    const unknown = header.filter((c) => !(CSV_COLUMNS as readonly string[]).includes(c));
    const missing = ['id', 'display_name'].filter((c) => !header.includes(c));
    if (unknown.length === 0 && missing.length === 0) return header;
    throw new AppError(
      'INVALID_ARGUMENT',
      `${fileName}: the CSV header is "${header.join(',')}"${missing.length ? `, without ${missing.join(' and ')}` : ''}` +
        `${unknown.length ? `${missing.length ? ' and' : ','} with unknown column${unknown.length > 1 ? 's' : ''} ${unknown.join(', ')}` : ''}; ` +
        `expected: ${CSV_COLUMNS.join(',')} (id and display_name required, the others optional, in any order)`,
      'csv_header',
    );
  };
}

/** Parses an import file by extension: JSON (the whole format) or CSV (contacts, one per row, with a header). */
export function parseImportFile(fileName: string, text: string): ImportData {
  if (/\.csv$/i.test(fileName)) {
    const rows = parseCsv(text, {
      columns: checkedHeader(fileName),
      skip_empty_lines: true,
      trim: true,
      bom: true,
    }) as Record<string, string>[];
    return {
      contacts: rows.map((r) => ({
        id: r.id ?? '',
        display_name: r.display_name ?? '',
        account: r.account || null,
        department: r.department || null,
        title: r.title || null,
        active: !/^(false|0|no)$/i.test(r.active ?? 'true'),
      })),
    };
  }
  return JSON.parse(text) as ImportData;
}

/** Loads `data` into the local store in one transaction (blobs are written first; they are content-addressed). */
export async function importData(knex: Knex, blobs: BlobStore, input: unknown): Promise<ImportSummary> {
  const data = ImportData.parse(input);
  const fileRows: Record<string, unknown>[] = [];
  for (const f of data.files) {
    const bytes = Buffer.from(f.content_base64, 'base64');
    const { sha256, size } = await blobs.put(bytes);
    if (sha256 !== createHash('sha256').update(bytes).digest('hex')) throw new Error('blob store corrupted');
    fileRows.push({
      id: f.id,
      message_id: f.message_id ?? null,
      conversation_id: f.conversation_id ?? null,
      file_name: f.file_name,
      mime_type: f.mime_type ?? null,
      size_bytes: size,
      sha256,
      ...(f.created_at ? { created_at: f.created_at } : {}),
    });
  }

  await knex.transaction(async (trx) => {
    const upsert = async (table: string, rows: Record<string, unknown>[]) => {
      if (rows.length > 0) await trx(table).insert(rows).onConflict('id').merge();
    };
    await upsert(
      'contacts',
      data.contacts.map((c) => ({
        ...c,
        account: c.account ?? null,
        department: c.department ?? null,
        title: c.title ?? null,
        external: c.external ?? null,
        name_key: searchKey(c.display_name),
        name_skeleton: skeletonOf(c.display_name),
        search_key: searchKey(c.display_name, c.account, c.department, c.title),
      })),
    );
    await upsert(
      'groups',
      data.groups.map(({ members: _members, ...g }) => ({
        ...g,
        owner_contact_id: g.owner_contact_id ?? null,
        name_key: searchKey(g.display_name),
        name_skeleton: skeletonOf(g.display_name),
      })),
    );
    for (const g of data.groups) {
      await trx('group_members').where('group_id', g.id).delete();
      if (g.members.length > 0) {
        await trx('group_members').insert(g.members.map((contact_id) => ({ group_id: g.id, contact_id })));
      }
    }
    await upsert(
      'conversations',
      data.conversations.map((c) => ({
        ...c,
        contact_id: c.contact_id ?? null,
        group_id: c.group_id ?? null,
        name_key: searchKey(c.display_name),
      })),
    );
    await upsert(
      'messages',
      data.messages.map((m) => ({
        ...m,
        sender_id: m.sender_id ?? null,
        sender_name: m.sender_name ?? null,
        received_at: m.received_at ?? null,
        text_key: searchKey(m.content_text),
      })),
    );
    await upsert('files', fileRows);
  });

  return {
    contacts: data.contacts.length,
    groups: data.groups.length,
    conversations: data.conversations.length,
    messages: data.messages.length,
    files: data.files.length,
  };
}

/**
 * Gives contacts and groups stored before names had skeletons theirs (TR39, for look-alike targets);
 * after the first start with the column this finds nothing to do.
 */
export async function fillNameSkeletons(knex: Knex): Promise<void> {
  for (const table of ['contacts', 'groups']) {
    const rows = (await knex(table).whereNull('name_skeleton').select('id', 'display_name')) as {
      id: string;
      display_name: string;
    }[];
    for (const r of rows) {
      await knex(table)
        .where({ id: r.id })
        .update({ name_skeleton: skeletonOf(r.display_name) });
    }
  }
}

/** Whether the local directory holds no contact yet (the first run then fills it with the demo data). */
export async function directoryIsEmpty(knex: Knex): Promise<boolean> {
  return !(await knex('contacts').first('id'));
}

/** The local directory as the operator's commands load it. */
export interface DirectoryImport {
  /** Loads `input` (an import file's data) in one transaction. */
  load(input: unknown): Promise<ImportSummary>;
  /** Whether the directory holds no contact yet. */
  isEmpty(): Promise<boolean>;
}

export function createDirectoryImport(knex: Knex, blobs: BlobStore): DirectoryImport {
  return { load: (input) => importData(knex, blobs, input), isEmpty: () => directoryIsEmpty(knex) };
}
