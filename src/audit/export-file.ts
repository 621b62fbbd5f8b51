import fs from 'node:fs';
import path from 'node:path';
import { AppError } from '../core/errors.ts';
import type { CheckpointDeps } from './checkpoints.ts';
import { exportAudit, ExportFilter, type Manifest } from './export.ts';
import { isUuid } from '../core/ids.ts';
import { writeAnchorsFile } from './anchors/index.ts';
import type { Queryable } from '../db/knex.ts';
import { agents } from './store/index.ts';

/** Which rows to export; the agent by name (or id), as people know it, never an internal id alone. */
export type ExportFileFilter = Omit<ExportFilter, 'agent_id'> & { agent?: string };

export interface ExportFileRequest {
  format: 'jsonl' | 'csv';
  filter: ExportFileFilter;
  /** Where the export goes; its manifest goes beside it, at `${path}.manifest.json`. */
  path: string;
  /** The file's name as the manifest records it: the name it will be verified under (default: path's). */
  name?: string;
  actor: string;
}

export interface ExportFileResult {
  path: string;
  manifest_path: string;
  manifest: Manifest;
  /** `${path}.anchors.jsonl`: the time-stamp tokens of the checkpoints in its range, when there are any. */
  anchors_path?: string;
}

/**
 * The id of the agent a filter names, by name or else by id. An agent nobody knows is refused: a signed
 * export of zero rows would read as proof that the agent did nothing, when the name was only mistyped.
 */
async function agentId(knex: Queryable, agent: string): Promise<string> {
  const byName = await agents.idNamed(knex, agent);
  const row = byName ?? (isUuid(agent) ? await agents.idOf(knex, agent) : undefined);
  if (!row) throw new AppError('NOT_FOUND', `no agent named "${agent}"`, 'unknown_agent');
  return row.id;
}

/** The filter exportAudit takes. Keys left empty are dropped: the manifest signs the filter as given. */
async function exportFilter(knex: Queryable, { agent, ...rest }: ExportFileFilter): Promise<ExportFilter> {
  const filter: ExportFilter = { ...rest, ...(agent ? { agent_id: await agentId(knex, agent) } : {}) };
  for (const k of Object.keys(filter) as (keyof ExportFilter)[])
    if (filter[k] === undefined) delete filter[k];
  return filter;
}

/** Opens the file before anything is exported, so that a path that cannot be written is a plain refusal. */
async function open(file: string): Promise<fs.promises.FileHandle> {
  try {
    return await fs.promises.open(file, 'w', 0o600);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const message = `cannot write ${file}: ${(err as Error).message}`;
    if (code === 'ENOENT' || code === 'ENOTDIR') throw new AppError('NOT_FOUND', message, code);
    if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS' || code === 'EISDIR')
      throw new AppError('PERMISSION_DENIED', message, code);
    throw err;
  }
}

/**
 * Writes an export of the audit log to `path` and its signed manifest beside it, both readable by their
 * owner only. The one way both the command line and the web pages export: the same filter rules, the
 * same refusals. On any failure neither file is left behind; exportAudit's refusals (CONFLICT
 * nothing_to_export, TAMPERED chain_broken) reach the caller as they are.
 */
export async function exportToFile(deps: CheckpointDeps, req: ExportFileRequest): Promise<ExportFileResult> {
  const filter = await exportFilter(deps.knex, req.filter);
  const manifestPath = `${req.path}.manifest.json`;
  const anchorsPath = `${req.path}.anchors.jsonl`;
  const out = (await open(req.path)).createWriteStream();
  // A write error (a full disk) fails this export at once: unhandled it would take down the process
  // (the server, when it writes for the command line), and the export could wait for a drain forever.
  const failed = new Promise<never>((_resolve, reject) => out.once('error', reject));
  failed.catch(() => {});
  try {
    const manifest = await Promise.race([
      exportAudit(deps, {
        format: req.format,
        filter,
        out,
        file: req.name ?? path.basename(req.path),
        actor: req.actor,
      }),
      failed,
    ]);
    await new Promise<void>((resolve, reject) =>
      out.end((err?: Error | null) => (err ? reject(err) : resolve())),
    );
    fs.writeFileSync(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o600 });
    const range = [manifest.first_seq ?? manifest.checkpoint.seq, manifest.checkpoint.seq] as const;
    const anchors = await writeAnchorsFile(deps.knex, anchorsPath, ...range);
    return {
      path: req.path,
      manifest_path: manifestPath,
      manifest,
      ...(anchors ? { anchors_path: anchors } : {}),
    };
  } catch (err) {
    out.destroy();
    fs.rmSync(req.path, { force: true });
    fs.rmSync(manifestPath, { force: true });
    fs.rmSync(anchorsPath, { force: true });
    throw err;
  }
}
