import fs from 'node:fs';
import { pipeline, Readable, Transform } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { z } from 'zod';
import type { Logger } from '../../log.ts';
import { AppError, isAppError } from '../../core/errors.ts';
import type { Connector, FileRecord, MessageRecord, Page, ResolvedTarget, TargetType } from '../types.ts';
import { createBridgeHttp, malformed, type BridgeConfig, type BridgeHttp } from './http.ts';
import {
  Sent,
  WireContact,
  WireConversation,
  WireFile,
  WireGroup,
  WireMessage,
  WireTarget,
  WriteLookup,
  page,
} from './wire.ts';

/** The bridge's cursor came back to us inside our own signed cursor; anything else means the first page. */
const cursorOf = (after: unknown) => (typeof after === 'string' ? after : undefined);

/** Checks the page size the bridge promised and keeps its cursor as the position after this page. */
function pageOf<T>(what: string, limit: number, answer: { items: T[]; next_cursor: string | null }): Page<T> {
  if (answer.items.length > limit) throw malformed(what, `${answer.items.length} items for limit ${limit}`);
  return { items: answer.items, next: answer.next_cursor };
}

const downloadRef = (fileId: string) => `bridge:file:${fileId}`;

const fileRecord = (f: z.infer<typeof WireFile>): FileRecord => ({
  ...f,
  download_ref: downloadRef(f.file_id),
});

/** A missing conversation or file is an answer (undefined), not a failure. */
async function unlessNotFound<T>(lookup: Promise<T>): Promise<T | undefined> {
  try {
    return await lookup;
  } catch (err) {
    if (isAppError(err, 'TARGET_NOT_FOUND')) return undefined;
    throw err;
  }
}

/** Counts the bytes of a download and fails it when the bridge sends more than the file's declared size. */
function capAt(size: number): Transform {
  let seen = 0;
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      seen += chunk.length;
      done(seen > size ? new Error(`the bridge sent more than the declared ${size} bytes`) : null, chunk);
    },
    flush(done) {
      done(seen < size ? new Error(`the bridge sent ${seen} of the declared ${size} bytes`) : null);
    },
  });
}

/** The argument a connector method takes. */
type Query<M extends Exclude<keyof Connector, 'source'>> = Parameters<Connector[M]>[0];

const seg = encodeURIComponent;

async function listFiles(http: BridgeHttp, q: Query<'listFiles'>): Promise<Page<FileRecord>> {
  const { conversationId, messageId, fileId, limit, after } = q;
  const answer = await http.json(
    {
      path: 'files',
      query: {
        conversation_id: conversationId,
        message_id: messageId,
        file_id: fileId,
        limit,
        cursor: cursorOf(after),
      },
    },
    page(WireFile),
  );
  const files = pageOf('GET /files', limit, answer);
  return { items: files.items.map(fileRecord), next: files.next };
}

async function listMessages(http: BridgeHttp, q: Query<'listMessages'>): Promise<Page<MessageRecord>> {
  const { conversationId, conversationType, keyword, since, includeAttachments, limit, after } = q;
  const answer = await http.json(
    {
      path: 'messages',
      query: {
        conversation_id: conversationId,
        conversation_type: conversationType,
        keyword,
        since,
        include_attachments: includeAttachments,
        limit,
        cursor: cursorOf(after),
      },
    },
    page(WireMessage),
  );
  const messages = pageOf('GET /messages', limit, answer);
  return {
    items: messages.items.map((m) => ({
      ...m,
      attachments: m.attachments.map((a) => ({ ...a, download_ref: downloadRef(a.file_id) })),
    })),
    next: messages.next,
  };
}

async function resolveTarget(http: BridgeHttp, type: TargetType, ref: string): Promise<ResolvedTarget> {
  const { target } = await http.json(
    { path: 'targets/resolve', query: { target_type: type, ref } },
    z.object({ target: WireTarget }),
  );
  if (target.target_type !== type) {
    throw malformed('GET /targets', `asked for a ${type}, got a ${target.target_type}`);
  }
  return target;
}

async function sendFile(http: BridgeHttp, { target, file, caption, key }: Query<'sendFile'>) {
  // The blob was hashed when the chair's approval was checked; these are the approved bytes.
  const bytes = await fs.promises.readFile(file.path);
  const sent = await http.json(
    {
      method: 'POST',
      path: 'files',
      key,
      body: {
        target_type: target.target_type,
        target_id: target.target_id,
        file_name: file.file_name,
        mime_type: file.mime_type,
        size_bytes: file.size_bytes,
        sha256: file.sha256,
        caption,
        content_base64: bytes.toString('base64'),
      },
    },
    Sent,
  );
  if (!sent.file_ref) throw malformed('POST /files', 'file_ref: missing');
  return { ref: sent.ref, file_ref: sent.file_ref };
}

async function findWrite(http: BridgeHttp, key: string): ReturnType<Connector['findWrite']> {
  const answer = await http.json({ path: `writes/${seg(key)}` }, WriteLookup);
  switch (answer.status) {
    case 'found':
      return { found: true, ref: answer.ref };
    case 'not_found':
      return { found: false };
    case 'pending':
      // Still in flight at the bridge: neither answer is true yet, so reconciliation asks again later.
      throw new AppError('CONNECTOR_FAILED', 'the write is still in progress at the bridge', 'write_pending');
    case 'unknown':
      return undefined;
  }
}

async function openFile(http: BridgeHttp, fileId: string) {
  const [record] = (await listFiles(http, { fileId, limit: 1 })).items;
  if (!record || record.file_id !== fileId) return undefined;
  const res = await unlessNotFound(http.bytes({ path: `files/${seg(fileId)}/content` }));
  if (!res) return undefined;
  if (!res.body) throw malformed('GET /files', 'no content');
  const body = Readable.fromWeb(res.body as WebReadableStream<Uint8Array>);
  // pipeline passes a failing download (timeout, reset) on to the stream the caller reads.
  const stream =
    record.size_bytes === null ? body : pipeline(body, capAt(record.size_bytes), () => undefined);
  return { record, stream };
}

/** A connector that talks to a messenger through the HTTP bridge contract in docs/bridge.md. */
export function createBridgeConnector(config: BridgeConfig, log?: Logger): Connector {
  const http = createBridgeHttp(config, log);
  return {
    source: 'bridge',
    async searchContacts({ query, includeInactive, limit, after }) {
      const answer = await http.json(
        {
          path: 'contacts',
          query: { query, include_inactive: includeInactive, limit, cursor: cursorOf(after) },
        },
        page(WireContact),
      );
      return pageOf('GET /contacts', limit, answer);
    },
    async searchGroups({ query, includeArchived, limit, after }) {
      const answer = await http.json(
        {
          path: 'groups',
          query: { query, include_archived: includeArchived, limit, cursor: cursorOf(after) },
        },
        page(WireGroup),
      );
      return pageOf('GET /groups', limit, answer);
    },
    async getConversation(id) {
      const answer = await unlessNotFound(
        http.json({ path: `conversations/${seg(id)}` }, z.object({ conversation: WireConversation })),
      );
      return answer?.conversation;
    },
    async findConversationsByName(name, type) {
      const answer = await http.json(
        { path: 'conversations', query: { name, conversation_type: type } },
        z.object({ items: z.array(WireConversation) }),
      );
      return answer.items;
    },
    listMessages: (q) => listMessages(http, q),
    listFiles: (q) => listFiles(http, q),
    resolveTarget: (type, ref) => resolveTarget(http, type, ref),
    async sendMessage({ target, text, key }) {
      const sent = await http.json(
        {
          method: 'POST',
          path: 'messages',
          key,
          body: { target_type: target.target_type, target_id: target.target_id, text },
        },
        Sent,
      );
      return { ref: sent.ref };
    },
    sendFile: (w) => sendFile(http, w),
    findWrite: (key) => findWrite(http, key),
    openFile: (fileId) => openFile(http, fileId),
  };
}
