import { z } from 'zod';
import { AppError } from '../../core/errors.ts';
import type { WriteToolDef } from '../types.ts';
import {
  resolveWriteTarget,
  refuseHiddenText,
  writeControlParams,
  messageRefOf,
  writeOutput,
  writeOutputFields,
  writeTargetParams,
} from './controls.ts';

const input = z.strictObject({
  ...writeTargetParams,
  content_text: z.string().min(1).describe('The exact text to send; the approval is bound to it.'),
  ...writeControlParams,
});

const output = z.object({
  ...writeOutputFields,
  message_ref: z.string().nullable(),
});

export const sendMessage = {
  name: 'send_message',
  title: 'Send message',
  description:
    'Send a text message to a contact, group or conversation. Defaults to dry_run, which requests approval ' +
    'and returns content_sha256 and an approval_request_id; once a chair approves, call again with the same ' +
    'content, dry_run=false and the approval_id (see get_approval).',
  facet: 'send',
  kind: 'write',
  input,
  output,
  async prepare(args, ctx) {
    const bytes = Buffer.byteLength(args.content_text, 'utf8');
    if (bytes > ctx.config.limits.max_message_bytes) {
      throw new AppError(
        'INVALID_ARGUMENT',
        `content_text is ${bytes} bytes; the limit is ${ctx.config.limits.max_message_bytes}`,
        'content_too_large',
      );
    }
    refuseHiddenText('content_text', args.content_text, ctx.config);
    const connector = ctx.connectors.pick(args.source_preference);
    const resolved = await resolveWriteTarget(connector, args.target_type, args.target_id);
    const { target } = resolved;
    return {
      source: connector.source,
      target,
      content: { content_text: args.content_text },
      review: { content_text: args.content_text, ...resolved.review },
      target_facts: resolved.target_facts,
      file_sha256: null,
      perform: async (key) => ({
        message_ref: (await connector.sendMessage({ target, text: args.content_text, key })).ref,
      }),
      present: (r) => ({
        ...writeOutput(r, target),
        message_ref: messageRefOf(r),
      }),
    };
  },
} satisfies WriteToolDef<typeof input, typeof output>;
