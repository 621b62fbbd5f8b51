import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import canonicalize from 'canonicalize';
import { AUDIT_FIELDS, rowFromDb, type AuditInput, type AuditRow } from '../../src/audit/chain.ts';
import { checkpointDeps } from '../../src/audit/context.ts';
import { exportAudit } from '../../src/audit/export.ts';
import { exportChunks, type ExportChunk } from '../../src/audit/export-copy.ts';
import { exportLines } from '../../src/audit/export-pages.ts';
import type { ExportFilter } from '../../src/audit/export-filter.ts';
import { toJsonLine } from '../../src/audit/format.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { loadConfig } from '../../src/config.ts';
import { type Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/server.ts';

/** Text that is awkward to write as JSON: escapes, controls, quotes, backslashes, RTL, astral. */
const AWKWARD = [
  '',
  '"quoted" \\ back\\slash \\u0041 /',
  '\b\f\n\r\t\u0001\u001f\u007f\u0080\u2028\u2029',
  'שלום עולם 王伟 é',
  '😀 𝄞 \ud83d\ude00',
  "it's -- ; drop table x",
  '\uffff\ue000\u{10000}',
];

/** Rows with awkward content in every field a caller fills, and details of every JSON shape. */
function awkwardInputs(): AuditInput[] {
  const inputs: AuditInput[] = [];
  for (const [i, text] of AWKWARD.entries()) {
    inputs.push({
      kind: i % 2 === 0 ? 'tool.call' : 'write.succeeded',
      request_id: text,
      trace_id: text || null,
      agent_id: `agent-${i % 3}`,
      actor: text,
      tool: text,
      source: 'local',
      target_type: 'contact',
      target_ref: text,
      approval_request_id: `ar-${text}`,
      approval_id: i % 2 === 0 ? null : `ap-${text}`,
      approvers: i % 3 === 0 ? null : [text, 'chair-ada', '😀'],
      dry_run: i % 3 === 0 ? null : i % 3 === 1,
      content_sha256: 'a'.repeat(64),
      file_sha256: null,
      result: i % 2 === 0 ? 'ok' : 'error',
      error_code: i % 2 === 0 ? null : 'INVALID_ARGUMENT',
      details: {
        zeta: text,
        [text]: text,
        Alpha: 1,
        nested: { z: [3, 2, 1], a: { y: null, b: true, [`é${text}`]: false }, m: [] },
        numbers: [1e21, 1e-7, 0.1, -0, 2 ** 53 - 1, 123456789.125, -5e-324, 1.7976931348623157e308],
        nothing: null,
        '': '',
        '\u00e9': 'é',
        '\ud83d\ude00': '😀',
        '\ue000': 'bmp private use sorts after an astral key in UTF-16',
      },
    });
  }
  inputs.push({ kind: 'tool.call', details: {} });
  return inputs;
}

async function collect(chunks: AsyncIterable<ExportChunk>) {
  const data: Buffer[] = [];
  const hashes: Buffer[] = [];
  const runs: { rows: number; first: number; last: { seq: number; hash: string } }[] = [];
  for await (const chunk of chunks) {
    data.push(Buffer.from(chunk.data));
    hashes.push(Buffer.from(chunk.hashes));
    runs.push({ rows: chunk.rows, first: chunk.first, last: chunk.last });
  }
  return { data: Buffer.concat(data), hashes: Buffer.concat(hashes).toString(), runs };
}

/** The line of a row written by the canonicalize package itself, with the chain links appended. */
const libraryLine = (row: AuditRow) => {
  const body = Object.fromEntries(AUDIT_FIELDS.map((f) => [f, row[f]]));
  return `${canonicalize(body)!.slice(0, -1)},"prev_hash":"${row.prev_hash}","hash":"${row.hash}"}\n`;
};

for (const kind of databaseKinds()) {
  describe(`JSONL export lines on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    let stored: AuditRow[];

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
      const log = createAuditLog(db.knex);
      // Enough rows for many chunks, with the awkward ones among them.
      const plain = Array.from({ length: 1500 }, (_, i): AuditInput => ({
        kind: 'tool.call',
        tool: `t${i % 7}`,
        agent_id: `agent-${i % 3}`,
        result: i % 5 === 0 ? 'error' : 'ok',
        details: { duration_ms: i, count: i % 21, args_sha256: 'b'.repeat(64) },
      }));
      for (const input of [...awkwardInputs(), ...plain, ...awkwardInputs()]) await log.append(input);
      const raw = (await db.knex('audit_events').orderBy('seq')) as unknown[];
      stored = raw.map(rowFromDb);
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    it('writes every row byte for byte as toJsonLine and the canonicalize package write it', async () => {
      const head = stored.at(-1)!.seq;
      const got = await collect(exportChunks(db.knex, {}, head));
      const expected = stored.map(toJsonLine).join('');
      assert.equal(stored.map(libraryLine).join(''), expected);
      assert.ok(got.data.equals(Buffer.from(expected)), 'the exported bytes are the canonical lines');
      assert.equal(got.hashes, stored.map((r) => `${r.hash}\n`).join(''));
      assert.equal(
        got.runs.reduce((n, r) => n + r.rows, 0),
        stored.length,
      );
      assert.equal(got.runs[0]!.first, 1);
      assert.deepEqual(got.runs.at(-1)!.last, { seq: head, hash: stored.at(-1)!.hash });
      assert.ok(got.runs.length > 1, 'several chunks');
    });

    it('stops at the head it is given, and writes each chunk whole', async () => {
      const upto = stored[999]!.seq;
      const got = await collect(exportChunks(db.knex, {}, upto));
      assert.equal(got.data.toString(), stored.slice(0, 1000).map(toJsonLine).join(''));
      for (const run of got.runs) assert.ok(run.first <= run.last.seq);
    });

    it('honours every filter, with values that would break a query written as text', async () => {
      const awkward = AWKWARD[1]!;
      const filters: ExportFilter[] = [
        { agent_id: 'agent-1' },
        { tool: awkward },
        { tool: "x' or '1'='1" },
        { target_ref: AWKWARD[5]! },
        { approval: `ar-${awkward}` },
        { approval: `ap-${AWKWARD[3]!}` },
        { kind: 'write.succeeded', result: 'error' },
        { since: stored[200]!.ts, until: stored[1200]!.ts },
        { since: stored[200]!.ts.replace('Z', '+02:00') },
      ];
      for (const filter of filters) {
        const head = stored.at(-1)!.seq;
        const got = await collect(exportChunks(db.knex, filter, head));
        const paged: string[] = [];
        for await (const page of exportLines(db.knex, filter, head)) paged.push(...page.map((r) => r.line));
        assert.equal(got.data.toString(), paged.join(''), JSON.stringify(filter));
        assert.ok(
          paged.length > 0 || filter.tool === "x' or '1'='1",
          `${JSON.stringify(filter)} matches rows`,
        );
      }
      const none = await collect(exportChunks(db.knex, { tool: "x' or '1'='1" }, stored.at(-1)!.seq));
      assert.equal(none.data.length, 0);
    });

    it('closes its stream when the reader stops early, and the next export runs in full', async () => {
      const open = exportChunks(db.knex, {}, stored.at(-1)!.seq);
      assert.equal((await open.next()).done, false);
      // The probe below sees a COPY while one is open, so that its zero later means something.
      if (kind === 'postgres') assert.equal(await copiesOpen(db), 1);
      await open.return(undefined);
      for (let i = 0; i < 12; i++) {
        for await (const chunk of exportChunks(db.knex, {}, stored.at(-1)!.seq)) {
          assert.ok(chunk.rows > 0);
          break;
        }
      }
      const got = await collect(exportChunks(db.knex, {}, stored.at(-1)!.seq));
      assert.equal(sha256(got.data), sha256(Buffer.from(stored.map(toJsonLine).join(''))));
      // Each COPY had a connection of its own: none of them is left open, let alone mid-COPY.
      if (kind === 'postgres') await noCopyLeft(db);
    });

    it('stops, and lets go of the database, when the file it writes to fails', async () => {
      const config = loadConfig(
        { ...(testDb.url ? { DATABASE_URL: testDb.url } : {}), COUNTERSIGN_DATA_DIR: testDb.dataDir },
        testDb.dataDir,
      );
      const deps = await checkpointDeps(db.knex, createAuditLog(db.knex), config);
      let written = 0;
      // A disk that fills up after 100 KB: every write after that fails, as with ENOSPC.
      const out = new Writable({
        write(chunk: Buffer, _encoding, done) {
          written += chunk.length;
          done(written > 100_000 ? Object.assign(new Error('no space left'), { code: 'ENOSPC' }) : null);
        },
      });
      out.on('error', () => {});
      await assert.rejects(
        exportAudit(deps, { format: 'jsonl', filter: {}, out, file: 'x.jsonl', actor: 'test' }),
        { code: 'ENOSPC' },
      );
      assert.ok(written < 2_000_000, `stopped soon after the failure (${written} bytes handed over)`);
      if (kind === 'postgres') await noCopyLeft(db);
    });

    // Last: it adds rows of its own, after the head the tests above export up to.
    it('writes any stored instant, uuid and sequence number as toJsonLine does', async () => {
      const instants = [
        '2000-01-01T00:00:00.000Z', // the database's epoch for binary timestamps
        '1999-12-31T23:59:59.999Z',
        '1970-01-01T00:00:00.001Z',
        '1812-06-24T12:00:00.050Z',
        '2026-12-01T09:05:07.005Z',
        '2026-12-01T09:05:07.999Z',
        '2026-12-01T09:05:08.000Z',
        '2284-12-31T23:59:59.990Z',
      ];
      const head = (await db.knex('audit_events').orderBy('seq', 'desc').first()) as {
        seq: number | string;
        hash: string;
      };
      const after = Number(head.seq);
      // Each a different number of digits, up to the largest a number holds exactly, with gaps of up to
      // 2^53 between them: the COPY path writes seq's digits itself, the pages (PGlite) cross the gaps.
      const seqs = [after + 1, 99_999, 100_000, 2 ** 31, 2 ** 32 + 7, 999_999_999_999, 10 ** 15, 2 ** 53 - 1];
      assert.ok(seqs[1]! > seqs[0]!, 'the stored rows end below 99,999');
      let seq = after;
      let prev = head.hash;
      for (const [i, ts] of instants.entries()) {
        seq = seqs[i]!;
        const row = {
          ...stored[i]!,
          seq,
          event_id: `0123abcd-ef01-4a2b-8c3d-${String(i).padStart(12, 'f')}`,
          ts,
          prev_hash: prev,
          hash: String(i).repeat(64),
        };
        prev = row.hash;
        await db.knex('audit_events').insert({
          ...row,
          approvers: row.approvers === null ? null : JSON.stringify(row.approvers),
          details: JSON.stringify(row.details),
        });
      }
      const added = (
        (await db.knex('audit_events').where('seq', '>', after).orderBy('seq')) as unknown[]
      ).map(rowFromDb);
      assert.deepEqual(
        added.map((r) => r.ts),
        instants,
      );
      const got = await collect(exportChunks(db.knex, { since: '1800-01-01T00:00:00Z' }, seq));
      const lines = got.data
        .toString()
        .split('\n')
        .slice(-instants.length - 1, -1);
      assert.deepEqual(
        lines,
        added.map((r) => toJsonLine(r).slice(0, -1)),
      );
    });
  });
}

/** Connections of this database whose last statement is an export's COPY (other than this one). */
async function copiesOpen(db: Database): Promise<number> {
  const { rows } = (await db.knex.raw(
    `select count(*)::int as n from pg_stat_activity
     where datname = current_database() and query ilike '%copy (select%' and pid <> pg_backend_pid()`,
  )) as { rows: { n: number }[] };
  return rows[0]!.n;
}

/** No COPY of an export is running or left open on the database (its connection is closed). */
async function noCopyLeft(db: Database) {
  await waitFor('the export COPY connections to close', async () =>
    (await copiesOpen(db)) === 0 ? true : undefined,
  );
}

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');
