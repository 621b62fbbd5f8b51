import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { AppError } from '../../core/errors.ts';
import { resolveInside } from '../paths.ts';
import type { WriteToolDef } from '../types.ts';
import {
  refuseHidden,
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
  file_path: z
    .string()
    .min(1)
    .max(1024)
    .describe(
      'The file to send. It must already be in the outbound directory (files.outbound_dir, by default ' +
        'data/outbound/ in the data directory): put it there first, then give its path relative to that ' +
        'directory ("report.pdf") or absolute. A path that leads outside it, by .. or a symlink, is ' +
        'PERMISSION_DENIED.',
    ),
  caption: z
    .string()
    .max(4096)
    .optional()
    .describe(
      'Text sent with the file, shown to the recipients beside it. The chair reviews it with the file, ' +
        'and it is part of what the approval is bound to.',
    ),
  ...writeControlParams,
});

const output = z.object({
  ...writeOutputFields,
  file_ref: z.string().nullable(),
  message_ref: z.string().nullable(),
  file_sha256: z.string(),
  file_size_bytes: z.number().int(),
});

const MIME: Record<string, string> = {
  '.txt': 'text/plain',
  '.md': 'text/markdown',
  '.csv': 'text/csv',
  '.json': 'application/json',
  '.pdf': 'application/pdf',
  '.png': 'image/png',
  '.jpg': 'image/jpeg',
  '.jpeg': 'image/jpeg',
  '.docx': 'application/vnd.openxmlformats-officedocument.wordprocessingml.document',
  '.xlsx': 'application/vnd.openxmlformats-officedocument.spreadsheetml.sheet',
};

/** Nothing in the directory but dot files (a .gitkeep). */
const isEmpty = (dir: string) => fs.readdirSync(dir).every((name) => name.startsWith('.'));

/**
 * Where the file should have been: the outbound directory by its path, and, when nothing is in it at all
 * (a first try, before any file was put there), what to do.
 */
function notFoundMessage(root: string, requested: string, empty: boolean): string {
  const said = `no file ${requested} in the outbound directory ${root}`;
  return empty
    ? `${said}: it is empty. Put the file there first (files.outbound_dir, env COUNTERSIGN_OUTBOUND_DIR), ` +
        'then give its path relative to it'
    : `${said}; file_path is relative to it, or absolute inside it`;
}

/** Reads the file (after checking it stays inside the outbound directory) and keeps its bytes by sha256. */
async function readOutbound(root: string, requested: string, maxBytes: number) {
  const real = resolveInside(root, requested, 'file_path');
  let stat: fs.Stats;
  try {
    stat = await fs.promises.stat(real);
  } catch {
    const empty = isEmpty(root);
    throw new AppError('TARGET_NOT_FOUND', notFoundMessage(root, requested, empty), 'file_not_found', {
      details: { outbound_dir: root, empty },
    });
  }
  if (!stat.isFile())
    throw new AppError('INVALID_ARGUMENT', `${requested} is not a regular file`, 'not_a_file');
  if (stat.size > maxBytes) {
    throw new AppError(
      'INVALID_ARGUMENT',
      `${requested} is ${stat.size} bytes; the limit is ${maxBytes}`,
      'file_too_large',
    );
  }
  const bytes = await fs.promises.readFile(real);
  if (bytes.length > maxBytes)
    throw new AppError('INVALID_ARGUMENT', `${requested} grew past the limit`, 'file_too_large');
  return { bytes, name: path.basename(real) };
}

export const sendFile = {
  name: 'send_file',
  title: 'Send file',
  description:
    'Send a file from the outbound directory (files.outbound_dir, by default data/outbound/: put the file ' +
    'there first) to a contact, group or conversation. Defaults to dry_run, ' +
    'which requests approval for exactly these bytes (file_sha256); execute with dry_run=false and the ' +
    'approval_id once approved. A file changed since approval is refused.',
  facet: 'send',
  kind: 'write',
  input,
  output,
  async prepare(args, ctx) {
    refuseHidden('target_id', args.target_id);
    refuseHidden('file_path', args.file_path);
    refuseHiddenText('caption', args.caption ?? null, ctx.config);
    const { bytes, name } = await readOutbound(
      ctx.config.files.outbound_dir,
      args.file_path,
      ctx.config.files.max_file_bytes,
    );
    refuseHidden('file name', name);
    const connector = ctx.connectors.pick(args.source_preference);
    const resolved = await resolveWriteTarget(connector, args.target_type, args.target_id);
    const { target } = resolved;
    // The bytes the chair reviews are the bytes that get sent: both come from the blob store.
    const blob = await ctx.blobs.put(bytes);
    const mime_type = MIME[path.extname(name).toLowerCase()] ?? 'application/octet-stream';
    const caption = args.caption ?? null;
    const file = {
      sha256: blob.sha256,
      size_bytes: blob.size,
      file_name: name,
      mime_type,
      path: ctx.blobs.pathOf(blob.sha256),
    };
    return {
      source: connector.source,
      target,
      content: { file_sha256: blob.sha256, file_name: name, caption },
      review: {
        file_name: name,
        file_size_bytes: blob.size,
        mime_type,
        file_sha256: blob.sha256,
        caption,
        ...resolved.review,
      },
      target_facts: resolved.target_facts,
      file_sha256: blob.sha256,
      async perform(key) {
        const sent = await connector.sendFile({ target, file, caption, key });
        return { message_ref: sent.ref, file_ref: sent.file_ref };
      },
      present: (r) => ({
        ...writeOutput(r, target),
        message_ref: messageRefOf(r),
        file_ref: (r.result?.file_ref as string | undefined) ?? null,
        file_sha256: blob.sha256,
        file_size_bytes: blob.size,
      }),
    };
  },
} satisfies WriteToolDef<typeof input, typeof output>;
