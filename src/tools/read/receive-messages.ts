import { z } from 'zod';
import { AppError } from '../../core/errors.ts';
import {
  cursorParam,
  idParam,
  limitParam,
  oneRequired,
  sourceField,
  sourcePreferenceParam,
} from '../params.ts';
import type { ReadToolDef } from '../types.ts';

const input = z
  .strictObject({
    conversation_id: idParam(
      'Conversation to read. One of conversation_id and query is required.',
    ).optional(),
    conversation_type: z
      .enum(['direct', 'group', 'system', 'unknown'])
      .optional()
      .describe('Only conversations of this type (unknown = any).'),
    query: z
      .string()
      .max(256)
      .optional()
      .describe(
        'A conversation name (exact, any case) to read that conversation; otherwise a keyword matched ' +
          'against message text. With conversation_id it filters that conversation by keyword. One of ' +
          'conversation_id and query is required.',
      ),
    since: z.iso
      .datetime({ offset: true })
      .optional()
      .describe('Only messages created at or after this time.'),
    limit: limitParam(50, 200),
    cursor: cursorParam,
    include_attachment_metadata: z
      .boolean()
      .default(true)
      .describe(
        "Default true: each message lists its attachments' metadata (file_id, file_name, size_bytes, " +
          'download_ref), which receive_files takes; never the bytes. false leaves attachments empty.',
      ),
    source_preference: sourcePreferenceParam,
    dry_run: z.boolean().default(false).describe('Return the read plan only, without message bodies.'),
  })
  .refine((a) => a.conversation_id !== undefined || (a.query ?? '').trim() !== '', {
    message: 'give conversation_id or a non-blank query',
    path: ['conversation_id'],
  });

oneRequired.add(input, { fields: ['conversation_id', 'query'] });

const Conversation = z.object({
  conversation_id: z.string(),
  conversation_type: z.enum(['direct', 'group', 'system']),
  display_name: z.string(),
});

const Message = z.object({
  message_id: z.string(),
  conversation_id: z.string(),
  sender_id: z.string().nullable(),
  sender_name: z.string().nullable(),
  content_type: z.enum(['text', 'image', 'file', 'rich', 'notify', 'unknown']),
  content_text: z.string(),
  attachments: z.array(
    z.object({
      file_id: z.string(),
      file_name: z.string(),
      size_bytes: z.number().int().nullable(),
      download_ref: z.string().nullable(),
    }),
  ),
  created_at: z.string().nullable(),
  received_at: z.string().nullable(),
  source: sourceField,
  raw_ref: z.string(),
});

const Plan = z.object({
  source: z.string(),
  conversation_id: z.string().nullable(),
  keyword: z.string().nullable(),
  conversation_type: z.string().nullable(),
  since: z.string().nullable(),
  limit: z.number().int(),
});

const output = z.object({
  conversation: Conversation.nullable(),
  messages: z.array(Message),
  plan: Plan.optional().describe('Present on dry_run: what would be read.'),
});

export const receiveMessages = {
  name: 'receive_messages',
  title: 'Receive messages',
  description:
    'Read recent messages, newest first: of one conversation (by conversation_id, or by its exact name as ' +
    'query), or across conversations by keyword. dry_run returns the plan without message bodies. Read-only.',
  facet: 'messages',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const connector = ctx.connectors.pick(args.source_preference);
    const type = args.conversation_type === 'unknown' ? undefined : args.conversation_type;
    const text = args.query?.trim() || undefined;

    let conversation = null;
    let keyword = text;
    if (args.conversation_id) {
      conversation = (await connector.getConversation(args.conversation_id)) ?? null;
      if (!conversation || (type && conversation.conversation_type !== type)) {
        throw new AppError(
          'TARGET_NOT_FOUND',
          `no conversation ${args.conversation_id}`,
          'conversation_not_found',
        );
      }
    } else if (text) {
      const named = await connector.findConversationsByName(text, type);
      if (named.length > 1) {
        throw new AppError(
          'AMBIGUOUS_TARGET',
          `${named.length} conversations are named "${text}"; pass conversation_id`,
          'several_conversations',
          { details: { candidates: named.map((c) => c.conversation_id) } },
        );
      }
      if (named[0]) {
        conversation = named[0];
        keyword = undefined;
      }
    }

    const plan = {
      source: connector.source,
      conversation_id: conversation?.conversation_id ?? null,
      keyword: keyword ?? null,
      conversation_type: type ?? null,
      since: args.since ?? null,
    };
    const auditFacts = {
      source: connector.source,
      target_type: conversation ? 'conversation' : null,
      target_ref: conversation?.conversation_id ?? null,
      dry_run: args.dry_run,
    };
    if (args.dry_run) {
      return {
        data: { conversation, messages: [], plan: { ...plan, limit: args.limit } },
        audit: auditFacts,
      };
    }

    const page = await ctx.cursors.page('receive_messages', plan, args.cursor, (after) =>
      connector.listMessages({
        conversationId: conversation?.conversation_id,
        conversationType: type,
        keyword,
        since: args.since,
        includeAttachments: args.include_attachment_metadata,
        limit: args.limit,
        after,
      }),
    );
    return {
      data: { conversation, messages: page.items.map((m) => ({ ...m, source: connector.source })) },
      empty: page.items.length === 0,
      next_cursor: page.next_cursor,
      audit: { ...auditFacts, details: { count: page.items.length } },
    };
  },
} satisfies ReadToolDef<typeof input, typeof output>;
