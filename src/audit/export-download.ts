import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { AppError } from '../core/errors.ts';
import { isUuid } from '../core/ids.ts';
import type { ExportRecord } from './export-records.ts';
import type { AuditLog } from './log.ts';
import { verifySignature, type Signer } from './signing.ts';

/** The formats an export is written in; a record naming another is refused like one pointing elsewhere. */
const FORMATS = new Set(['jsonl', 'csv']);

/** What serving an export relies on: the host's exports directory and signing key, and the log. */
export interface ExportDownloadDeps {
  /** `<data dir>/exports`: the only directory an export file is ever read from. */
  exportsDir: string;
  signer: Signer;
  audit: AuditLog;
}

/** Where the export `id` in `format` lives: its name is made from its id, never read from its record. */
export const exportFileOf = (exportsDir: string, id: string, format: 'jsonl' | 'csv') =>
  path.join(exportsDir, `${id}.${format}`);

/** How an export record that cannot be trusted was found out; each is refused TAMPERED. */
type Refusal =
  'export_path_outside' | 'export_manifest_unsigned' | 'export_unverifiable' | 'export_file_changed';

/**
 * Opens the file of an export for download. The record comes from the database, which is storage, not a
 * trust root: its file is looked up from its id inside the exports directory (a record naming any other
 * path is refused), its manifest must carry this host's signature, and the file's bytes must hash to the
 * manifest's `file_sha256` before a byte is served. The bytes are hashed and then served from one open
 * descriptor, so the file checked is the file sent. A refusal is TAMPERED and recorded as an
 * `audit.tampered` row naming the export; the caller answers it.
 */
export async function openExportFile(
  deps: ExportDownloadDeps,
  exp: ExportRecord,
  actor: string,
): Promise<Readable> {
  const refuse = async (reason: Refusal, detail: string): Promise<never> => {
    await deps.audit.append({
      kind: 'audit.tampered',
      actor,
      result: 'error',
      error_code: 'TAMPERED',
      details: { reason, seq: null, detail, export_id: exp.id, found_at: new Date().toISOString() },
    });
    throw new AppError('TAMPERED', `export ${exp.id}: ${detail}`, reason);
  };
  const format = exp.format as 'jsonl' | 'csv';
  const file = isUuid(exp.id) && FORMATS.has(format) ? exportFileOf(deps.exportsDir, exp.id, format) : null;
  if (!file || exp.file_path !== file)
    return refuse('export_path_outside', 'its record names a file outside the exports directory');
  const { signature, ...unsigned } = exp.manifest;
  if (
    exp.manifest.public_key !== deps.signer.public_key ||
    !verifySignature(deps.signer.public_key, unsigned, signature)
  )
    return refuse('export_manifest_unsigned', "its manifest does not carry this server's signature");
  if (typeof exp.manifest.file_sha256 !== 'string')
    return refuse('export_unverifiable', "its manifest records no file_sha256 to check the file's bytes by");
  const handle = await openRegular(file).catch(() => null);
  if (!handle) return refuse('export_file_changed', 'its file is missing or not a regular file');
  try {
    const digest = createHash('sha256');
    for await (const chunk of handle.createReadStream({
      start: 0,
      autoClose: false,
    }) as AsyncIterable<Buffer>)
      digest.update(chunk);
    if (digest.digest('hex') !== exp.manifest.file_sha256)
      return await refuse('export_file_changed', "its file's bytes do not match its signed manifest");
    return handle.createReadStream({ start: 0 });
  } catch (err) {
    await handle.close();
    throw err;
  }
}

/** The file opened for reading, refusing a symbolic link in its last part and anything but a file. */
async function openRegular(file: string): Promise<fs.promises.FileHandle> {
  const handle = await fs.promises.open(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  if (!(await handle.stat()).isFile()) {
    await handle.close();
    throw new Error('not a regular file');
  }
  return handle;
}
