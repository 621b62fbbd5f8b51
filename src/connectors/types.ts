import type { MessageTargetType } from '../core/schemas.ts';
/** What a connector returns; tools shape these into the contract's output fields. */

/**
 * The fence a local write passes before it lands, given by approval (which owns the approval's row):
 * a query with one binding, the write key (the approval_id), that returns a row only while the write may
 * still land, locking what it reads until the write commits. The local store runs it in the write's
 * own statement or transaction, so a write that reconciliation settled meanwhile writes nothing.
 */
export interface WriteFence {
  sql: string;
}

export interface ContactRecord {
  contact_id: string;
  display_name: string;
  account: string | null;
  department: string | null;
  title: string | null;
  active: boolean;
  confidence: number;
  raw_ref: string;
}

export interface GroupRecord {
  group_id: string;
  display_name: string;
  member_count: number | null;
  owner_ref: string | null;
  archived: boolean;
  confidence: number;
  raw_ref: string;
}

export type ConversationType = 'direct' | 'group' | 'system';

export interface ConversationRecord {
  conversation_id: string;
  conversation_type: ConversationType;
  display_name: string;
}

export interface AttachmentRecord {
  file_id: string;
  file_name: string;
  size_bytes: number | null;
  download_ref: string | null;
}

export interface MessageRecord {
  message_id: string;
  conversation_id: string;
  sender_id: string | null;
  sender_name: string | null;
  content_type: 'text' | 'image' | 'file' | 'rich' | 'notify' | 'unknown';
  content_text: string;
  attachments: AttachmentRecord[];
  created_at: string | null;
  received_at: string | null;
  raw_ref: string;
}

export interface FileRecord {
  file_id: string;
  message_id: string | null;
  conversation_id: string | null;
  file_name: string;
  size_bytes: number | null;
  mime_type: string | null;
  created_at: string | null;
  download_ref: string | null;
  sha256: string | null;
}

/** A page of results and the position after its last item (JSON, wrapped into a signed cursor by the tool). */
export interface Page<T> {
  items: T[];
  next: unknown;
}

export interface PageRequest {
  limit: number;
  after?: unknown;
}

/** The targets a connector resolves (src/core/schemas.ts). */
export type TargetType = MessageTargetType;

export interface ResolvedTarget {
  target_type: TargetType;
  target_id: string;
  display_name: string | null;
  /** Other directory entries whose names look the same (same TR39 skeleton), where the connector knows. */
  lookalikes?: { target_id: string; display_name: string }[];
  /** A group's member count, where the connector knows it (approval rules: target.member_count). */
  member_count?: number;
  /** False where the connector knows the target is inside the organisation (approval rules: target.external). */
  external?: boolean;
}

/** A file to send, already stored by sha256 in countersign's blob store. */
export interface OutgoingFile {
  sha256: string;
  size_bytes: number;
  file_name: string;
  mime_type: string | null;
  /** Where the bytes are on disk (the blob). */
  path: string;
}

export interface Connector {
  /** Reported as `source` in outputs and the audit log: `local`, `bridge`, `mcp:<name>`. */
  readonly source: string;
  searchContacts(q: { query: string; includeInactive: boolean } & PageRequest): Promise<Page<ContactRecord>>;
  searchGroups(q: { query: string; includeArchived: boolean } & PageRequest): Promise<Page<GroupRecord>>;
  getConversation(id: string): Promise<ConversationRecord | undefined>;
  /** Conversations whose display name equals `name` (case- and normalisation-insensitive). */
  findConversationsByName(name: string, type?: ConversationType): Promise<ConversationRecord[]>;
  listMessages(
    q: {
      conversationId?: string;
      conversationType?: ConversationType;
      keyword?: string;
      since?: string;
      includeAttachments: boolean;
    } & PageRequest,
  ): Promise<Page<MessageRecord>>;
  listFiles(
    q: { conversationId?: string; messageId?: string; fileId?: string } & PageRequest,
  ): Promise<Page<FileRecord>>;
  /**
   * Resolves a write target by id, or else by exact name or account; several matches are
   * AMBIGUOUS_TARGET, none TARGET_NOT_FOUND (both as AppError).
   */
  resolveTarget(type: TargetType, ref: string): Promise<ResolvedTarget>;
  /** Sends once per `key` (the approval_id): a repeated key returns the first write's reference. */
  sendMessage(w: { target: ResolvedTarget; text: string; key: string }): Promise<{ ref: string }>;
  sendFile(w: {
    target: ResolvedTarget;
    file: OutgoingFile;
    caption: string | null;
    key: string;
  }): Promise<{ ref: string; file_ref: string }>;
  /** Whether the write keyed `key` happened: found, definitely not, or undefined when it cannot tell. */
  findWrite(key: string): Promise<{ found: true; ref: string } | { found: false } | undefined>;
  /** The bytes of a file, as a readable stream, with its record. */
  openFile(fileId: string): Promise<{ record: FileRecord; stream: NodeJS.ReadableStream } | undefined>;
}
