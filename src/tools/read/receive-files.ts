import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { z } from 'zod';
import type { FileRecord } from '../../connectors/index.ts';
import { AppError } from '../../core/errors.ts';
import { resolveInside, safeFileName } from '../paths.ts';
import { cursorParam, idParam, limitParam, sourceField, sourcePreferenceParam } from '../params.ts';
import type { ReadToolDef } from '../types.ts';

const input = z
  .strictObject({
    conversation_id: idParam('Only files of this conversation.').optional(),
    message_id: idParam('Only files attached to this message.').optional(),
    file_id: idParam('One file.').optional(),
    mode: z
      .enum(['list', 'download'])
      .default('list')
      .describe(
        "list (default): the files' metadata, nothing saved. download: save them into output_dir, " +
          'a dry run (the planned paths) unless dry_run is false.',
      ),
    output_dir: z
      .string()
      .min(1)
      .max(1024)
      .optional()
      .describe(
        'Required for download: a directory inside the configured download directory (relative to it, or absolute).',
      ),
    limit: limitParam(50, 200),
    cursor: cursorParam,
    source_preference: sourcePreferenceParam,
    dry_run: z
      .boolean()
      .optional()
      .describe('Default true for download (lists planned destinations, writes nothing); ignored for list.'),
  })
  .refine((a) => a.mode === 'list' || a.output_dir !== undefined, {
    message: 'output_dir is required for download',
    path: ['output_dir'],
  })
  .refine((a) => a.mode === 'list' || a.file_id || a.message_id || a.conversation_id, {
    message: 'download needs file_id, message_id or conversation_id',
    path: ['file_id'],
  });

const File = z.object({
  file_id: z.string(),
  message_id: z.string().nullable(),
  conversation_id: z.string().nullable(),
  file_name: z.string(),
  size_bytes: z.number().int().nullable(),
  mime_type: z.string().nullable(),
  created_at: z.string().nullable(),
  download_ref: z.string().nullable(),
  saved_path: z.string().nullable().describe('Where the file was (or, on dry_run, would be) saved.'),
  sha256: z.string().nullable().describe('SHA-256 of the file; for a download, of the bytes saved.'),
  source: sourceField,
});

const output = z.object({
  mode: z.enum(['list', 'download']).describe('The mode asked for.'),
  files: z.array(File),
});

/** Picks `dir/name`, or `dir/name (n).ext` when taken, without ever overwriting. */
function freePath(dir: string, name: string, taken: Set<string>): string {
  const ext = path.extname(name);
  const stem = name.slice(0, name.length - ext.length);
  for (let n = 0; ; n++) {
    const candidate = path.join(dir, n === 0 ? name : `${stem} (${n})${ext}`);
    if (!taken.has(candidate) && !fs.existsSync(candidate)) {
      taken.add(candidate);
      return candidate;
    }
  }
}

export const receiveFiles = {
  name: 'receive_files',
  title: 'Receive files',
  description:
    'List files shared in conversations, or download them into the configured download directory. ' +
    'Download defaults to dry_run (shows the planned destinations). Never changes the messenger.',
  facet: 'files',
  kind: 'read',
  input,
  output,
  async handler(args, ctx) {
    const connector = ctx.connectors.pick(args.source_preference);
    const download = args.mode === 'download';
    const dryRun = download ? (args.dry_run ?? true) : false;
    const dir = download
      ? resolveInside(ctx.config.files.download_dir, args.output_dir!, 'output_dir')
      : null;

    if (args.conversation_id && !(await connector.getConversation(args.conversation_id))) {
      throw new AppError(
        'TARGET_NOT_FOUND',
        `no conversation ${args.conversation_id}`,
        'conversation_not_found',
      );
    }
    const query = {
      conversation_id: args.conversation_id ?? null,
      message_id: args.message_id ?? null,
      file_id: args.file_id ?? null,
      source: connector.source,
    };
    const page = await ctx.cursors.page('receive_files', query, args.cursor, (after) =>
      connector.listFiles({
        conversationId: args.conversation_id,
        messageId: args.message_id,
        fileId: args.file_id,
        limit: args.limit,
        after,
      }),
    );
    if (args.file_id && page.items.length === 0) {
      throw new AppError('TARGET_NOT_FOUND', `no file ${args.file_id}`, 'file_not_found');
    }

    const taken = new Set<string>();
    const files = [];
    for (const record of page.items) {
      let saved_path: string | null = null;
      let sha256 = record.sha256;
      if (dir) {
        saved_path = freePath(dir, safeFileName(record.file_name, record.file_id), taken);
        if (!dryRun) sha256 = await save(connector, record, saved_path, dir);
      }
      files.push({ ...record, saved_path, sha256, source: connector.source });
    }

    return {
      data: { mode: args.mode, files },
      empty: files.length === 0,
      next_cursor: page.next_cursor,
      audit: {
        source: connector.source,
        dry_run: dryRun,
        target_type: args.file_id
          ? 'file'
          : args.message_id
            ? 'message'
            : args.conversation_id
              ? 'conversation'
              : null,
        target_ref: args.file_id ?? args.message_id ?? args.conversation_id ?? null,
        file_sha256: files.length === 1 ? files[0]!.sha256 : null,
        details: { count: files.length, downloaded: download && !dryRun ? files.length : 0 },
      },
    };
  },
} satisfies ReadToolDef<typeof input, typeof output>;

/** Streams one file to `target` (created exclusively: never through a pre-placed symlink), hashing as it goes. */
async function save(
  connector: {
    openFile(id: string): Promise<{ record: FileRecord; stream: NodeJS.ReadableStream } | undefined>;
  },
  record: FileRecord,
  target: string,
  dir: string,
): Promise<string> {
  const opened = await connector.openFile(record.file_id);
  if (!opened) throw new AppError('TARGET_NOT_FOUND', `no file ${record.file_id}`, 'file_not_found');
  await fs.promises.mkdir(dir, { recursive: true });
  // The directory may have been swapped for a symlink since it was checked; check its real path again.
  if (fs.realpathSync(dir) !== dir) {
    throw new AppError(
      'PERMISSION_DENIED',
      'output_dir changed while downloading',
      'path_outside_allowed_dir',
    );
  }
  const hash = createHash('sha256');
  const out = fs.createWriteStream(target, { flags: 'wx' });
  try {
    await pipeline(
      opened.stream,
      async function* (source: AsyncIterable<Buffer | string>) {
        for await (const chunk of source) {
          hash.update(chunk);
          yield chunk;
        }
      },
      out,
    );
  } catch (err) {
    await fs.promises.rm(target, { force: true });
    throw new AppError('CONNECTOR_FAILED', `could not save ${record.file_name}`, 'download_failed', {
      cause: err,
    });
  }
  const sha256 = hash.digest('hex');
  if (record.sha256 && sha256 !== record.sha256) {
    await fs.promises.rm(target, { force: true });
    throw new AppError(
      'CONNECTOR_FAILED',
      `${record.file_name} does not match its recorded sha256`,
      'hash_mismatch',
    );
  }
  return sha256;
}
