import { z } from 'zod';
import type { ErrorCode } from '../../core/errors.ts';
import { MessageTargetType } from '../../core/schemas.ts';

/**
 * The JSON a bridge sends and receives (docs/bridge.md), as zod schemas shared by the client and the
 * reference bridge. Objects are not strict: a bridge may add fields, and countersign ignores them.
 * Nullable fields may be left out and read as null.
 */

const maybe = <T extends z.ZodType>(schema: T) => schema.nullable().default(null);
const id = z.string().min(1).max(256);
const timestamp = maybe(z.iso.datetime({ offset: true }));

export const WireContact = z.object({
  contact_id: id,
  display_name: z.string(),
  account: maybe(z.string()),
  department: maybe(z.string()),
  title: maybe(z.string()),
  active: z.boolean(),
  confidence: z.number().min(0).max(1),
  raw_ref: z.string(),
});

export const WireGroup = z.object({
  group_id: id,
  display_name: z.string(),
  member_count: maybe(z.number().int().min(0)),
  owner_ref: maybe(z.string()),
  archived: z.boolean(),
  confidence: z.number().min(0).max(1),
  raw_ref: z.string(),
});

export const ConversationType = z.enum(['direct', 'group', 'system']);

export const WireConversation = z.object({
  conversation_id: id,
  conversation_type: ConversationType,
  display_name: z.string(),
});

export const WireAttachment = z.object({
  file_id: id,
  file_name: z.string(),
  size_bytes: maybe(z.number().int().min(0)),
});

export const WireMessage = z.object({
  message_id: id,
  conversation_id: id,
  sender_id: maybe(z.string()),
  sender_name: maybe(z.string()),
  content_type: z.enum(['text', 'image', 'file', 'rich', 'notify', 'unknown']),
  content_text: z.string(),
  attachments: z.array(WireAttachment).default([]),
  created_at: timestamp,
  received_at: timestamp,
  raw_ref: z.string(),
});

export const WireFile = z.object({
  file_id: id,
  message_id: maybe(z.string()),
  conversation_id: maybe(z.string()),
  file_name: z.string(),
  size_bytes: maybe(z.number().int().min(0)),
  mime_type: maybe(z.string()),
  created_at: timestamp,
  sha256: maybe(z.string().regex(/^[0-9a-f]{64}$/, 'lowercase hex SHA-256')),
});

/** One page of a list; `next_cursor` is the bridge's own opaque string, null on the last page. */
export const page = <T extends z.ZodType>(item: T) =>
  z.object({ items: z.array(item), next_cursor: maybe(z.string().min(1).max(1024)) });

export const TargetType = MessageTargetType;

export const WireTarget = z.object({
  target_type: TargetType,
  target_id: id,
  display_name: maybe(z.string()),
});

/** Body of POST /messages. */
export const SendMessageBody = z.strictObject({
  target_type: TargetType,
  target_id: id,
  text: z.string(),
});

/** Body of POST /files: the bytes travel base64-encoded, with their size and SHA-256 to check. */
export const SendFileBody = z.strictObject({
  target_type: TargetType,
  target_id: id,
  file_name: z.string().min(1),
  mime_type: z.string().nullable(),
  size_bytes: z.number().int().min(0),
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
  caption: z.string().nullable(),
  content_base64: z.string(),
});

export const Sent = z.object({ ref: z.string().min(1), file_ref: maybe(z.string().min(1)) });

/** GET /writes/{key}: what became of the write with this Idempotency-Key. */
export const WriteLookup = z.discriminatedUnion('status', [
  z.object({ status: z.literal('found'), ref: z.string().min(1), file_ref: maybe(z.string()) }),
  z.object({ status: z.literal('not_found') }),
  z.object({ status: z.literal('pending') }),
  z.object({ status: z.literal('unknown') }),
]);

/** The bridge's own error kinds and the tool error code each becomes. */
export const BridgeErrorKind = z.enum([
  'NOT_LOGGED_IN',
  'PERMISSION_DENIED',
  'TARGET_NOT_FOUND',
  'AMBIGUOUS_TARGET',
  'INVALID_ARGUMENT',
  'IDEMPOTENCY_CONFLICT',
  'RATE_LIMITED',
  'UNAVAILABLE',
]);
export type BridgeErrorKind = z.infer<typeof BridgeErrorKind>;

export const ERROR_CODE = {
  NOT_LOGGED_IN: 'NOT_LOGGED_IN',
  PERMISSION_DENIED: 'PERMISSION_DENIED',
  TARGET_NOT_FOUND: 'TARGET_NOT_FOUND',
  AMBIGUOUS_TARGET: 'AMBIGUOUS_TARGET',
  INVALID_ARGUMENT: 'INVALID_ARGUMENT',
  IDEMPOTENCY_CONFLICT: 'IDEMPOTENCY_CONFLICT',
  RATE_LIMITED: 'RATE_LIMITED',
  UNAVAILABLE: 'SOURCE_UNAVAILABLE',
} as const satisfies Record<BridgeErrorKind, ErrorCode>;

/** The HTTP status a bridge should pair with each kind (countersign reads the kind, not the status). */
export const ERROR_STATUS = {
  NOT_LOGGED_IN: 503,
  PERMISSION_DENIED: 403,
  TARGET_NOT_FOUND: 404,
  AMBIGUOUS_TARGET: 409,
  INVALID_ARGUMENT: 400,
  IDEMPOTENCY_CONFLICT: 409,
  RATE_LIMITED: 429,
  UNAVAILABLE: 503,
} as const satisfies Record<BridgeErrorKind, number>;

/** Any error answer: `kind` is free text so that an unknown kind is still a well-formed error. */
export const ErrorBody = z.object({
  error: z.object({
    kind: z.string().min(1),
    message: z.string().default(''),
    candidates: z
      .array(z.object({ target_id: z.string(), display_name: z.string().nullable().default(null) }))
      .optional(),
  }),
});
export type ErrorBody = z.input<typeof ErrorBody>;
