import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { AppError } from '../../core/errors.ts';
import { named } from '../../db/knex.ts';
import { skeletonOf } from '../../core/visible.ts';
import type { OutgoingFile, ResolvedTarget, TargetType, WriteFence } from '../types.ts';
import { searchKey } from './keys.ts';

type Row = Record<string, unknown>;

const TABLE: Record<TargetType, string> = {
  contact: 'contacts',
  group: 'groups',
  conversation: 'conversations',
};

/**
 * Up to five other contacts and groups whose names have the same TR39 skeleton as the row's (look
 * alike), as a JSON array: selected with the target itself, so finding them costs no statement.
 */
const LOOKALIKES = `(select coalesce(json_agg(l), '[]') from (
    select id as target_id, display_name from contacts where name_skeleton = t.name_skeleton and id <> t.id
    union all
    select id as target_id, display_name from groups where name_skeleton = t.name_skeleton and id <> t.id
    order by 1 limit 5) l) as lookalikes`;

/** A group's member count, selected with the group (approval rules read it as target.member_count). */
const MEMBER_COUNT = '(select count(*) from group_members m where m.group_id = t.id) as member_count';

/**
 * Whether a group reaches outside the organisation: true when one of its members is outside or not
 * known to be inside, false when every member is known inside, null for a group of none.
 */
const ANY_EXTERNAL = `(select bool_or(coalesce(c.external, true)) from group_members m
    join contacts c on c.id = m.contact_id where m.group_id = t.id) as any_external`;

/** What the directory knows of a target's being outside the organisation; undefined: not known. */
const externalOf = (type: TargetType, row: Row): boolean | undefined => {
  const known = type === 'contact' ? row.external : type === 'group' ? row.any_external : null;
  return typeof known === 'boolean' ? known : undefined;
};

/**
 * The target's row, with its look-alikes where the directory has names to compare (not conversations),
 * and a group's member count and whether it reaches outside the organisation.
 */
const targetQuery = (knex: Knex, type: TargetType) => {
  const q = knex(`${TABLE[type]} as t`).select('t.*');
  if (type === 'group') q.select(knex.raw(MEMBER_COUNT), knex.raw(ANY_EXTERNAL));
  return type === 'conversation' ? q : q.select(knex.raw(LOOKALIKES));
};

/**
 * The directory's contacts and groups (up to five) whose names have the skeleton of `name`: the
 * entries a target another connector resolved (the bridge's) looks like. One indexed statement.
 */
export async function directoryLookalikes(
  knex: Knex,
  name: string,
): Promise<{ target_id: string; display_name: string }[]> {
  const skeleton = skeletonOf(name);
  const rows = (await knex
    .select('id as target_id', 'display_name')
    .from('contacts')
    .where({ name_skeleton: skeleton })
    .unionAll((q) =>
      q.select('id as target_id', 'display_name').from('groups').where({ name_skeleton: skeleton }),
    )
    .orderBy('target_id')
    .limit(5)) as Row[];
  return rows.map((l) => ({ target_id: String(l.target_id), display_name: String(l.display_name) }));
}

/** The look-alikes column as read: parsed JSON (pg) or its text (PGlite). */
function lookalikesOf(row: Row): ResolvedTarget['lookalikes'] {
  const raw = typeof row.lookalikes === 'string' ? (JSON.parse(row.lookalikes) as unknown) : row.lookalikes;
  if (!Array.isArray(raw) || raw.length === 0) return undefined;
  return (raw as Row[]).map((l) => ({
    target_id: String(l.target_id),
    display_name: String(l.display_name),
  }));
}

/** By id first; else by exact (normalised) name, or account for contacts. */
export async function resolveLocalTarget(knex: Knex, type: TargetType, ref: string): Promise<ResolvedTarget> {
  const table = TABLE[type];
  let rows = (await named(
    knex,
    `countersign_target_${table}`,
    targetQuery(knex, type).where('t.id', ref).limit(1),
  )) as Row[];
  if (rows.length === 0) {
    const q = targetQuery(knex, type).where('t.name_key', searchKey(ref));
    if (type === 'contact') q.orWhere('t.account', ref);
    rows = (await q.orderBy('t.id').limit(10)) as Row[];
  }
  if (rows.length === 0) throw new AppError('TARGET_NOT_FOUND', `no ${type} "${ref}"`, `${type}_not_found`);
  if (rows.length > 1) {
    throw new AppError(
      'AMBIGUOUS_TARGET',
      `${rows.length} ${type}s match "${ref}"; pass the id`,
      'several_matches',
      {
        details: {
          candidates: rows.map((r) => ({ target_id: String(r.id), display_name: String(r.display_name) })),
        },
      },
    );
  }
  const row = rows[0]!;
  if (type === 'contact' && row.active === false) {
    throw new AppError('PERMISSION_DENIED', `contact ${String(row.id)} is inactive`, 'contact_inactive');
  }
  if (type === 'group' && row.archived === true) {
    throw new AppError('PERMISSION_DENIED', `group ${String(row.id)} is archived`, 'group_archived');
  }
  const lookalikes = lookalikesOf(row);
  return {
    target_type: type,
    target_id: String(row.id),
    display_name: String(row.display_name),
    ...(lookalikes ? { lookalikes } : {}),
    ...(type === 'group' ? { member_count: Number(row.member_count) } : {}),
    ...(externalOf(type, row) === undefined ? {} : { external: externalOf(type, row) }),
  };
}

/** The conversation a send to `target` lands in; a contact or group without one gets it created. */
async function conversationFor(trx: Knex.Transaction, target: ResolvedTarget): Promise<string> {
  if (target.target_type === 'conversation') return target.target_id;
  const column = target.target_type === 'contact' ? 'contact_id' : 'group_id';
  const existing = (await trx('conversations').where(column, target.target_id).orderBy('id').first()) as
    Row | undefined;
  if (existing) return String(existing.id);
  const id = `cv_${randomUUID()}`;
  const name = target.display_name ?? target.target_id;
  await trx('conversations').insert({
    id,
    conversation_type: target.target_type === 'contact' ? 'direct' : 'group',
    display_name: name,
    name_key: searchKey(name),
    [column]: target.target_id,
  });
  return id;
}

type LocalWrite = { target: ResolvedTarget; text: string; key: string; file?: OutgoingFile };

/** The outgoing message row for `w`, but its conversation. */
function messageRow(w: LocalWrite, id: string, now: string) {
  return {
    id,
    direction: 'outgoing',
    sender_id: null,
    sender_name: null,
    content_type: w.file ? 'file' : 'text',
    content_text: w.text,
    text_key: searchKey(w.text),
    created_at: now,
    received_at: null,
    write_key: w.key,
  };
}

/** The refusal of a write whose approval is no longer executing (reconciliation settled it). */
const fenced = () =>
  new AppError(
    'CONNECTOR_FAILED',
    'the approval is no longer executing: nothing was written',
    'write_fenced',
  );

/**
 * A text message into an existing conversation in one statement, behind the fence: inserted unless
 * the write key is already there (the unique write_key settles a race). Undefined when the target has
 * no conversation yet, the key names a write already made, or the fence holds: the transaction below
 * handles each.
 */
async function sendTextAtOnce(knex: Knex, w: LocalWrite, fence: WriteFence): Promise<string | undefined> {
  const row = messageRow(w, `ms_${randomUUID()}`, new Date().toISOString());
  const columns = Object.keys(row);
  const conversation =
    w.target.target_type === 'conversation'
      ? { sql: 'select id from conversations where id = ?', binding: w.target.target_id }
      : {
          sql: `select id from conversations where ${w.target.target_type === 'contact' ? 'contact_id' : 'group_id'} = ? order by id limit 1`,
          binding: w.target.target_id,
        };
  const result = (await knex.raw(
    `with fence as materialized (${fence.sql}),
     conv as (${conversation.sql}),
     ins as (insert into messages (conversation_id, ${columns.join(', ')})
       select conv.id, ${columns.map((c) => `r.${c}`).join(', ')}
       from fence, conv, json_populate_record(null::messages, ?::json) r
       on conflict (write_key) do nothing returning id)
     select id from ins`,
    [w.key, conversation.binding, JSON.stringify(row)],
  )) as { rows: { id: string }[] };
  return result.rows[0]?.id;
}

/**
 * Inserts the outgoing message unless one with this write key exists; returns its id either way. Only
 * while `fence` (approval's: the approval the key names is executing) holds; otherwise CONNECTOR_FAILED
 * `write_fenced`.
 */
export async function sendLocal(
  knex: Knex,
  w: LocalWrite,
  fence: WriteFence,
): Promise<{ ref: string; file_ref: string | null }> {
  if (!w.file) {
    const id = await sendTextAtOnce(knex, w, fence);
    if (id) return { ref: id, file_ref: null };
  }
  return knex.transaction(async (trx) => {
    if (((await trx.raw(fence.sql, [w.key])) as { rows: unknown[] }).rows.length === 0) throw fenced();
    const prior = (await trx('messages').where({ write_key: w.key }).first()) as Row | undefined;
    if (prior) {
      const f = (await trx('files').where({ message_id: prior.id }).first()) as Row | undefined;
      return { ref: String(prior.id), file_ref: f ? String(f.id) : null };
    }
    const conversationId = await conversationFor(trx, w.target);
    const now = new Date().toISOString();
    const id = `ms_${randomUUID()}`;
    await trx('messages').insert({ ...messageRow(w, id, now), conversation_id: conversationId });
    let fileRef: string | null = null;
    if (w.file) {
      fileRef = `fl_${randomUUID()}`;
      await trx('files').insert({
        id: fileRef,
        message_id: id,
        conversation_id: conversationId,
        file_name: w.file.file_name,
        mime_type: w.file.mime_type,
        size_bytes: w.file.size_bytes,
        sha256: w.file.sha256,
        created_at: now,
      });
    }
    return { ref: id, file_ref: fileRef };
  });
}

/** The write keyed `key`, if it was made; certain only under the approval's row lock (the fence). */
export async function findLocalWrite(knex: Knex, key: string) {
  const row = (await knex('messages').where({ write_key: key }).first()) as Row | undefined;
  return row ? { found: true as const, ref: String(row.id) } : { found: false as const };
}
