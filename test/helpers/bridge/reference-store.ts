import type { z } from 'zod';
import { BridgeFailure, CONFIDENCE, norm, rank, sha256, type ReferenceSeed } from './reference-data.ts';
import type {
  SendFileBody,
  SendMessageBody,
  WireConversation,
  WireFile,
  WireMessage,
  WireTarget,
} from '../../../src/connectors/bridge/wire.ts';

type Conversation = ReferenceSeed['conversations'][number];
type Target = z.output<typeof WireTarget>;
type StoredMessage = ReferenceSeed['messages'][number];
type StoredFile = Omit<z.output<typeof WireFile>, 'sha256' | 'size_bytes'> & { bytes: Buffer };

/** A write the reference messenger really performed, keyed by the Idempotency-Key it came with. */
export interface SentWrite {
  key: string;
  ref: string;
  file_ref: string | null;
  target_type: Target['target_type'];
  target_id: string;
  text: string;
  file: { file_name: string; mime_type: string | null; sha256: string; bytes: Buffer } | null;
}

const byRankThenName = <T extends { r: number; name: string; id: string }>(a: T, b: T) =>
  a.r - b.r || (a.name < b.name ? -1 : a.name > b.name ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

const newestFirst = (a: { at: string | null; id: string }, b: { at: string | null; id: string }) =>
  (b.at ?? '').localeCompare(a.at ?? '') || b.id.localeCompare(a.id);

/** The reference messenger's state and the operations the HTTP layer exposes; no HTTP in here. */
export function createReferenceStore(seed: ReferenceSeed) {
  const contacts = seed.contacts.map((c) => ({ ...c }));
  const groups = seed.groups.map((g) => ({ ...g, members: [...g.members] }));
  const conversations: Conversation[] = seed.conversations.map((c) => ({ ...c }));
  const messages: StoredMessage[] = seed.messages.map((m) => ({ ...m }));
  const files: StoredFile[] = seed.files.map(({ content, ...f }) => ({ ...f, bytes: Buffer.from(content) }));
  const sent: SentWrite[] = [];
  let counter = 0;

  const fileMeta = (f: StoredFile): z.output<typeof WireFile> => {
    const { bytes, ...meta } = f;
    return { ...meta, size_bytes: bytes.length, sha256: sha256(bytes) };
  };
  const conversationOf = (c: Conversation): z.output<typeof WireConversation> => ({
    conversation_id: c.conversation_id,
    conversation_type: c.conversation_type,
    display_name: c.display_name,
  });

  /** The one conversation a send to `target` lands in; created for a contact or group that has none. */
  function conversationFor(target: Target): Conversation {
    const found = conversations.find((c) =>
      target.target_type === 'conversation'
        ? c.conversation_id === target.target_id
        : target.target_type === 'contact'
          ? c.contact_id === target.target_id
          : c.group_id === target.target_id,
    );
    if (found) return found;
    const created: Conversation = {
      conversation_id: `c-new-${++counter}`,
      conversation_type: target.target_type === 'group' ? 'group' : 'direct',
      display_name: target.display_name ?? target.target_id,
      ...(target.target_type === 'contact'
        ? { contact_id: target.target_id }
        : { group_id: target.target_id }),
    };
    conversations.push(created);
    return created;
  }

  function resolve(type: Target['target_type'], ref: string): Target {
    const candidates =
      type === 'contact'
        ? contacts.map((c) => ({
            id: c.contact_id,
            name: c.display_name,
            alt: c.account,
            blocked: !c.active,
          }))
        : type === 'group'
          ? groups.map((g) => ({ id: g.group_id, name: g.display_name, alt: null, blocked: g.archived }))
          : conversations.map((c) => ({
              id: c.conversation_id,
              name: c.display_name,
              alt: null,
              blocked: false,
            }));
    let matches = candidates.filter((c) => c.id === ref);
    if (matches.length === 0) matches = candidates.filter((c) => norm(c.name) === norm(ref) || c.alt === ref);
    if (matches.length === 0) throw new BridgeFailure('TARGET_NOT_FOUND', `no ${type} "${ref}"`);
    if (matches.length > 1) {
      throw new BridgeFailure(
        'AMBIGUOUS_TARGET',
        `${matches.length} ${type}s match "${ref}"`,
        matches.map((m) => ({ target_id: m.id, display_name: m.name })),
      );
    }
    const match = matches[0]!;
    if (match.blocked)
      throw new BridgeFailure('PERMISSION_DENIED', `${type} ${match.id} cannot receive messages`);
    return { target_type: type, target_id: match.id, display_name: match.name };
  }

  /** Appends the outgoing message (and file) to the target's conversation. */
  function deliver(key: string, target: Target, text: string, file: SentWrite['file']): SentWrite {
    const conversation = conversationFor(target);
    const at = new Date().toISOString();
    const ref = `m-out-${++counter}`;
    messages.push({
      message_id: ref,
      conversation_id: conversation.conversation_id,
      sender_id: null,
      sender_name: null,
      content_type: file ? 'file' : 'text',
      content_text: text,
      created_at: at,
      received_at: null,
    });
    let file_ref: string | null = null;
    if (file) {
      file_ref = `f-out-${++counter}`;
      files.push({
        file_id: file_ref,
        message_id: ref,
        conversation_id: conversation.conversation_id,
        file_name: file.file_name,
        mime_type: file.mime_type,
        created_at: at,
        bytes: file.bytes,
      });
    }
    const write: SentWrite = {
      key,
      ref,
      file_ref,
      target_type: target.target_type,
      target_id: target.target_id,
      text,
      file,
    };
    sent.push(write);
    return write;
  }

  return {
    sent,

    searchContacts(query: string, includeInactive: boolean) {
      const q = norm(query);
      return contacts
        .filter((c) => includeInactive || c.active)
        .map((c) => ({
          c,
          r: rank(q, c.display_name, [c.account, c.department, c.title]),
          name: c.display_name,
          id: c.contact_id,
        }))
        .filter((x): x is typeof x & { r: number } => x.r !== undefined)
        .sort(byRankThenName)
        .map(({ c, r }) => ({ ...c, confidence: CONFIDENCE[r]!, raw_ref: `ref:contact:${c.contact_id}` }));
    },

    searchGroups(query: string, includeArchived: boolean) {
      const q = norm(query);
      return groups
        .filter((g) => includeArchived || !g.archived)
        .map((g) => ({ g, r: rank(q, g.display_name, []), name: g.display_name, id: g.group_id }))
        .filter((x): x is typeof x & { r: number } => x.r !== undefined)
        .sort(byRankThenName)
        .map(({ g: { members, ...g }, r }) => ({
          ...g,
          member_count: members.length,
          confidence: CONFIDENCE[r]!,
          raw_ref: `ref:group:${g.group_id}`,
        }));
    },

    conversation(id: string) {
      const found = conversations.find((c) => c.conversation_id === id);
      if (!found) throw new BridgeFailure('TARGET_NOT_FOUND', `no conversation ${id}`);
      return conversationOf(found);
    },

    conversationsByName(name: string, type: string | undefined) {
      return conversations
        .filter((c) => norm(c.display_name) === norm(name) && (!type || c.conversation_type === type))
        .map(conversationOf);
    },

    messages(f: {
      conversation_id?: string;
      conversation_type?: string;
      keyword?: string;
      since?: string;
      attachments: boolean;
    }) {
      const typeOf = new Map(conversations.map((c) => [c.conversation_id, c.conversation_type]));
      return messages
        .filter(
          (m) =>
            (!f.conversation_id || m.conversation_id === f.conversation_id) &&
            (!f.conversation_type || typeOf.get(m.conversation_id) === f.conversation_type) &&
            (!f.keyword || norm(m.content_text).includes(norm(f.keyword))) &&
            (!f.since || (m.created_at ?? '') >= new Date(f.since).toISOString()),
        )
        .sort((a, b) =>
          newestFirst({ at: a.created_at, id: a.message_id }, { at: b.created_at, id: b.message_id }),
        )
        .map((m): z.output<typeof WireMessage> => ({
          ...m,
          attachments: f.attachments
            ? files
                .filter((x) => x.message_id === m.message_id)
                .map((x) => ({ file_id: x.file_id, file_name: x.file_name, size_bytes: x.bytes.length }))
            : [],
          raw_ref: `ref:message:${m.message_id}`,
        }));
    },

    files(f: { conversation_id?: string; message_id?: string; file_id?: string }) {
      return files
        .filter(
          (x) =>
            (!f.conversation_id || x.conversation_id === f.conversation_id) &&
            (!f.message_id || x.message_id === f.message_id) &&
            (!f.file_id || x.file_id === f.file_id),
        )
        .sort((a, b) => newestFirst({ at: a.created_at, id: a.file_id }, { at: b.created_at, id: b.file_id }))
        .map(fileMeta);
    },

    fileBytes(id: string): Buffer {
      const found = files.find((x) => x.file_id === id);
      if (!found) throw new BridgeFailure('TARGET_NOT_FOUND', `no file ${id}`);
      return found.bytes;
    },

    resolve,

    sendMessage(key: string, body: z.output<typeof SendMessageBody>): SentWrite {
      return deliver(key, resolve(body.target_type, body.target_id), body.text, null);
    },

    sendFile(key: string, body: z.output<typeof SendFileBody>): SentWrite {
      const bytes = Buffer.from(body.content_base64, 'base64');
      if (bytes.length !== body.size_bytes || sha256(bytes) !== body.sha256) {
        throw new BridgeFailure('INVALID_ARGUMENT', 'the file bytes do not match size_bytes and sha256');
      }
      const target = resolve(body.target_type, body.target_id);
      const file = { file_name: body.file_name, mime_type: body.mime_type, sha256: body.sha256, bytes };
      return deliver(key, target, body.caption ?? '', file);
    },
  };
}

export type ReferenceStore = ReturnType<typeof createReferenceStore>;
