import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { NextFunction, Request, RequestHandler, Response, Router } from 'express';
import {
  type AuditReader,
  type Checkpointer,
  type ExportRecords,
  isNothingToExport,
  type Manifest,
  exportFileOf,
  openExportFile,
  AuditQuery,
} from '../audit/index.ts';
import { AuditKind } from '../core/audit-kinds.ts';
import type { Config } from '../config.ts';
import { HTTP_STATUS, isAppError } from '../core/errors.ts';
import type { PageKit } from './kit.ts';
import type { WebSession } from './sessions.ts';

const PAGE = 50;

export interface AuditPageDeps {
  /** The log, read: the list, a row, the head, the last checkpoint, the chain's check. */
  reader: AuditReader;
  /** Where exports are recorded and found again by id. */
  exports: ExportRecords;
  /** What an export signs its manifest with. */
  checkpoints: Checkpointer;
  config: Config;
}

/** The filters of a request's query string that parse; the rest are ignored (and shown as empty). */
function filtersOf(query: Request['query']): AuditQuery {
  const picked = Object.fromEntries(
    Object.entries(query).filter(([k, v]) => typeof v === 'string' && v !== '' && k in AuditQuery.shape),
  );
  for (const k of ['since', 'until'] as const) {
    // <input type="datetime-local"> sends 2026-11-30T10:00: read it as UTC.
    if (typeof picked[k] === 'string' && /^\d{4}-\d\d-\d\dT\d\d:\d\d$/.test(picked[k] as string))
      picked[k] += ':00Z';
  }
  const parsed = AuditQuery.safeParse(picked);
  return parsed.success ? parsed.data : {};
}

/**
 * Compliance pages: browse, filter and page the log, see a row, check the chain, export. Read-only for
 * every role (an export is recorded, never anything else); compliance and admin users only.
 */
export function mountAuditPages(router: Router, kit: PageKit, deps: AuditPageDeps): void {
  const requireAuditor = (_req: Request, res: Response, next: NextFunction) => {
    const roles = (res.locals.session as WebSession).user.roles;
    if (roles.includes('compliance') || roles.includes('admin')) return next();
    kit.render(res, 403, 'error.njk', {
      title: 'Not allowed',
      message: 'The audit log is for compliance and admin users.',
    });
  };
  const guard = [kit.requireUser, requireAuditor];
  mountLogPages(router, kit, guard, deps.reader);
  mountExportPages(router, kit, guard, deps);
}

/** The log itself: a filtered page of rows, one row, the chain's check. */
function mountLogPages(router: Router, kit: PageKit, guard: RequestHandler[], reader: AuditReader): void {
  router.get('/audit', ...guard, async (req, res) => {
    const filter = filtersOf(req.query);
    const before = Number.parseInt(String(req.query.before ?? ''), 10);
    const rows = await reader.query(filter, {
      beforeSeq: before > 0 ? before : undefined,
      limit: PAGE + 1,
    });
    const [head, checkpoint] = await Promise.all([reader.headSeq(), reader.latestCheckpoint()]);
    const qs = (extra: Record<string, string>) =>
      new URLSearchParams({ ...(filter as Record<string, string>), ...extra }).toString();
    kit.render(res, 200, 'audit.njk', {
      rows: rows.slice(0, PAGE),
      filter,
      kinds: AuditKind.options,
      head,
      checkpoint,
      older: rows.length > PAGE ? `/audit?${qs({ before: String(rows[PAGE - 1]!.seq) })}` : null,
      newest: before > 0 ? `/audit?${qs({})}` : null,
    });
  });

  router.get('/audit/verify', ...guard, async (_req, res) => {
    const result = await reader.verify();
    kit.render(res, 200, 'audit-verify.njk', { result });
  });

  router.get('/audit/rows/:seq', ...guard, async (req, res) => {
    const row = /^\d{1,15}$/.test(String(req.params.seq))
      ? await reader.row(Number(req.params.seq))
      : undefined;
    if (!row)
      return kit.render(res, 404, 'error.njk', {
        title: 'Not found',
        message: 'There is no such audit row.',
      });
    kit.render(res, 200, 'audit-row.njk', { row, details: JSON.stringify(row.details, null, 2) });
  });
}

/**
 * Exports: made from the log page's filters into the data directory (file and manifest, recorded in
 * audit_exports), then shown and downloaded by id.
 */
function mountExportPages(router: Router, kit: PageKit, guard: RequestHandler[], deps: AuditPageDeps): void {
  const { exports } = deps;
  const exportsDir = path.join(deps.config.data_dir, 'exports');

  router.post('/audit/export', ...guard, kit.requireCsrf, async (req, res) => {
    const body = req.body as Record<string, string | undefined>;
    const format = body.format === 'csv' ? 'csv' : 'jsonl';
    const { since, until, agent, tool, kind, result, target, approval } = filtersOf(body as Request['query']);
    const id = randomUUID();
    fs.mkdirSync(exportsDir, { recursive: true });
    const session = res.locals.session as WebSession;
    let manifest: Manifest;
    let file: string;
    try {
      ({ manifest, path: file } = await deps.checkpoints.exportToFile({
        format,
        filter: { since, until, agent, tool, kind, result, target_ref: target, approval },
        path: exportFileOf(exportsDir, id, format),
        name: `audit-${id}.${format}`,
        actor: session.user.name,
      }));
    } catch (err) {
      if (isNothingToExport(err))
        return kit.render(res, 409, 'error.njk', { title: 'Nothing to export', message: err.message });
      if (isAppError(err, 'NOT_FOUND', 'unknown_agent'))
        return kit.render(res, HTTP_STATUS.NOT_FOUND, 'error.njk', {
          title: 'No such agent',
          message: `No agent is named "${agent}": nothing was exported. Correct the agent filter and try again.`,
        });
      throw err;
    }
    await exports.recordExport({ id, actor: session.user.name, format, file_path: file, manifest });
    res.redirect(303, `/audit/exports/${id}`);
  });

  router.get('/audit/exports/:id', ...guard, async (req, res) => {
    const exp = await exports.findExport(String(req.params.id));
    if (!exp)
      return kit.render(res, 404, 'error.njk', { title: 'Not found', message: 'There is no such export.' });
    kit.render(res, 200, 'audit-export.njk', { exp, manifest: exp.manifest });
  });

  router.get('/audit/exports/:id/:part', ...guard, async (req, res) => {
    const exp = await exports.findExport(String(req.params.id));
    if (!exp || !['file', 'manifest'].includes(String(req.params.part))) {
      return kit.render(res, 404, 'error.njk', { title: 'Not found', message: 'There is no such export.' });
    }
    const name = `audit-${exp.id}.${exp.format}`;
    if (req.params.part === 'manifest') {
      const manifest = JSON.stringify(exp.manifest, null, 2);
      res.attachment(`${name}.manifest.json`).type('application/json').send(manifest);
      return;
    }
    const session = res.locals.session as WebSession;
    const file = await openExportFile(
      { exportsDir, signer: deps.checkpoints.signer, audit: deps.checkpoints.audit },
      exp,
      session.user.name,
    ).catch((err: unknown) => {
      if (isAppError(err, 'TAMPERED')) return err;
      throw err;
    });
    if (!('pipe' in file))
      return kit.render(res, HTTP_STATUS.TAMPERED, 'error.njk', {
        title: 'Export refused',
        message: `This export cannot be served: ${file.message}. The refusal is recorded in the audit log.`,
      });
    res.attachment(name).type(exp.format === 'csv' ? 'text/csv' : 'application/x-ndjson');
    file.pipe(res);
  });
}
