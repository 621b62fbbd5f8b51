/**
 * One timed job of figures (c) and (d), in its own process so that its peak RSS is its own:
 *
 *   export URL DATA_DIR FILE   the real export (JSONL, signed manifest beside it)
 *   copy URL FILE MAX_SEQ      COPY (rows up to MAX_SEQ, in seq order) TO STDOUT into FILE
 *   verify FILE                the real offline verifier, against FILE.manifest.json
 *   hash FILE                  one sha256 per line of FILE
 *
 * Prints one JSON line on stdout: seconds (the job alone, not process start-up), rows, peak RSS.
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { checkpointDeps } from '../src/audit/context.ts';
import { exportAudit, type Manifest } from '../src/audit/export.ts';
import { createAuditLog } from '../src/audit/log.ts';
import { lazyHostRoots } from '../src/db/host-roots.ts';
import { verifyExport } from '../src/audit/verify-export.ts';
import { loadConfig } from '../src/config.ts';
import { openDatabase } from '../src/db/knex.ts';
import { EXPORT_COLUMNS } from '../src/audit/format.ts';
import { copyOut } from './lib/copy.ts';

const [mode, ...args] = process.argv.slice(2);
const closeFile = (out: fs.WriteStream) =>
  new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));

async function run(): Promise<Record<string, unknown>> {
  switch (mode) {
    case 'export': {
      const [url, dataDir, file] = args as [string, string, string];
      const config = loadConfig({ DATABASE_URL: url, COUNTERSIGN_DATA_DIR: dataDir }, dataDir);
      const db = await openDatabase({ url, pgliteDir: '', command: 'bench export' });
      const deps = await checkpointDeps(
        db.knex,
        createAuditLog(db.knex, { roots: lazyHostRoots(db.knex, config.secrets.host_roots_path) }),
        config,
      );
      const t0 = performance.now();
      const out = fs.createWriteStream(file);
      const manifest = await exportAudit(deps, {
        format: 'jsonl',
        filter: {},
        out,
        file: path.basename(file),
        actor: 'bench',
      });
      await closeFile(out);
      const seconds = (performance.now() - t0) / 1000;
      fs.writeFileSync(`${file}.manifest.json`, JSON.stringify(manifest));
      await db.close();
      return { seconds, rows: manifest.row_count, bytes: fs.statSync(file).size };
    }
    case 'copy': {
      const [url, file, maxSeq] = args as [string, string, string];
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      const t0 = performance.now();
      const out = fs.createWriteStream(file);
      const sql = `copy (select ${EXPORT_COLUMNS.join(', ')} from audit_events where seq <= ${Number(maxSeq)} order by seq) to stdout`;
      const bytes = await copyOut(client, sql, out);
      await closeFile(out);
      const seconds = (performance.now() - t0) / 1000;
      await client.end();
      return { seconds, rows: Number(maxSeq), bytes };
    }
    case 'verify': {
      const [file] = args as [string];
      const manifest = JSON.parse(fs.readFileSync(`${file}.manifest.json`, 'utf8')) as Manifest;
      const t0 = performance.now();
      const report = await verifyExport(file, manifest);
      return {
        seconds: (performance.now() - t0) / 1000,
        rows: report.rows,
        valid: report.valid,
        ok: report.ok,
      };
    }
    case 'hash': {
      const [file] = args as [string];
      const t0 = performance.now();
      let rows = 0;
      let rest: Buffer = Buffer.alloc(0);
      for await (const chunk of fs.createReadStream(file, {
        highWaterMark: 1 << 20,
      }) as AsyncIterable<Buffer>) {
        const buf = rest.length > 0 ? Buffer.concat([rest, chunk]) : chunk;
        let from = 0;
        for (let nl = buf.indexOf(10, from); nl !== -1; nl = buf.indexOf(10, from)) {
          createHash('sha256').update(buf.subarray(from, nl)).digest();
          rows++;
          from = nl + 1;
        }
        rest = buf.subarray(from);
      }
      return { seconds: (performance.now() - t0) / 1000, rows };
    }
    default:
      throw new Error(`unknown mode ${mode}`);
  }
}

const result = await run();
process.stdout.write(`${JSON.stringify({ ...result, max_rss_mb: process.resourceUsage().maxRSS / 1024 })}\n`);
