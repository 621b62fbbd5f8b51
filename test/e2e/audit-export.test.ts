import assert from 'node:assert/strict';
import { createHash, generateKeyPairSync } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { listCheckpoints } from '../../src/audit/checkpoints.ts';
import { exportAudit, type Manifest } from '../../src/audit/export.ts';
import { EXPORT_COLUMNS } from '../../src/audit/format.ts';
import { verifyExport } from '../../src/audit/verify-export.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { pinArgs, runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer, checkpointDepsOf } from '../helpers/server.ts';

type Line = Record<string, unknown>;

for (const kind of databaseKinds()) {
  describe(`audit export and offline verification on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let dir: string;

    /** Exports in-process into `dir`, returning the file, its manifest and its lines. */
    async function exportTo(format: 'jsonl' | 'csv', filter: Record<string, string> = {}) {
      const file = path.join(dir, `export-${Date.now()}-${Math.random().toString(36).slice(2)}.${format}`);
      const out = fs.createWriteStream(file);
      const manifest = await exportAudit(checkpointDepsOf(server), {
        format,
        filter,
        out,
        file: path.basename(file),
        actor: 'test',
      });
      await new Promise<void>((r) => out.end(() => r()));
      fs.writeFileSync(`${file}.manifest.json`, JSON.stringify(manifest));
      return { file, manifest };
    }
    const jsonl = (file: string) =>
      fs
        .readFileSync(file, 'utf8')
        .trimEnd()
        .split('\n')
        .map((l) => JSON.parse(l) as Line);
    const writeJsonl = (file: string, lines: Line[]) =>
      fs.writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      dir = fs.mkdtempSync(path.join(server.db.dataDir, 'exports-'));
      // A varied log: reads, a refused call, a dry run with its approval request.
      await call(agent, 'isphere_search_contacts', { query: '=cmd|calc' });
      await call(agent, 'isphere_search_contacts', { query: 'דוד' });
      await call(agent, 'isphere_receive_messages', { conversation_id: 'cv_alpha' });
      await call(agent, 'isphere_search_contacts', {});
      await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_wang',
        content_text: '+1 @here =SUM(A1)',
      });
      // A failed sign-in records the name typed, formula and all.
      for (const name of ['=HYPERLINK("http://x")', '@SUM(1)', "'quoted"]) {
        await new WebClient(server.url).login(name, 'nope');
      }
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    for (const format of ['jsonl', 'csv'] as const) {
      it(`round-trips an unfiltered ${format} export through verification`, async () => {
        const { file, manifest } = await exportTo(format);
        assert.equal(manifest.filtered, false);
        assert.equal(manifest.first_seq, 1);
        assert.equal(manifest.last_seq, manifest.checkpoint.seq);
        assert.equal(manifest.last_hash, manifest.checkpoint.head_hash);
        const report = await verifyExport(file, manifest);
        assert.equal(report.ok, true, JSON.stringify(report.first_bad));
        assert.equal(report.valid, manifest.row_count);
        assert.equal(report.signature, 'valid');
        assert.equal(report.checkpoint, 'valid');
      });
    }

    it('round-trips a filtered export, and the export itself is audited', async () => {
      const { file, manifest } = await exportTo('csv', { kind: 'tool.call', result: 'error' });
      assert.equal(manifest.filtered, true);
      assert.ok(manifest.row_count >= 1);
      assert.equal((await verifyExport(file, manifest)).ok, true);
      const created = await server.sql('audit_events').where({ kind: 'export.created' });
      assert.ok(created.length >= 3);
      assert.ok(await server.sql('audit_events').where({ kind: 'checkpoint' }).first());
    });

    it('exports only the rows of one target, or of one approval, and says so in the signed filter', async () => {
      const byTarget = await exportTo('jsonl', { target_ref: 'ct_wang' });
      const rows = jsonl(byTarget.file);
      const expected = await server.sql('audit_events').where({ target_ref: 'ct_wang' }).count('* as n');
      assert.equal(rows.length, Number(expected[0]!.n));
      assert.ok(rows.length >= 2, 'the dry run and its approval request');
      assert.ok(rows.every((r) => r.target_ref === 'ct_wang'));
      assert.deepEqual([byTarget.manifest.filtered, byTarget.manifest.filter.target_ref], [true, 'ct_wang']);
      assert.equal((await verifyExport(byTarget.file, byTarget.manifest)).ok, true);

      const requestId = rows.find((r) => r.approval_request_id)!.approval_request_id as string;
      const byApproval = await exportTo('csv', { approval: requestId });
      const ofApproval = await server
        .sql('audit_events')
        .where({ approval_request_id: requestId })
        .orWhere({ approval_id: requestId });
      assert.ok(ofApproval.length >= 1);
      assert.equal(byApproval.manifest.row_count, ofApproval.length);
      assert.equal(byApproval.manifest.filter.approval, requestId);
      assert.equal((await verifyExport(byApproval.file, byApproval.manifest)).ok, true);
    });

    it('neutralises CSV cells a spreadsheet would run as formulas', async () => {
      const { file } = await exportTo('csv');
      const text = fs.readFileSync(file, 'utf8');
      assert.equal(text.split('\n')[0], EXPORT_COLUMNS.join(','));
      assert.ok(text.includes(`"'=HYPERLINK(""http://x"")"`), 'formula neutralised');
      assert.ok(text.includes(`"'@SUM(1)"`));
      assert.ok(text.includes(`"''quoted"`), 'a leading apostrophe is doubled, so the rule reverses exactly');
      for (const cell of text.split(/[,\n]/)) {
        const value = cell.startsWith('"') ? cell.slice(1) : cell;
        assert.ok(!/^[=+@\t\r]/.test(value), `unsafe cell: ${cell}`);
      }
    });

    describe('detects and locates tampering', () => {
      let base: { file: string; manifest: Manifest; text: string[] };
      let lines: Line[];
      const tampered = async (mutate: (lines: Line[]) => Line[], manifest?: Manifest, pubkey?: string) => {
        const file = path.join(dir, `tampered-${Math.random().toString(36).slice(2)}.jsonl`);
        writeJsonl(file, mutate(structuredClone(lines)));
        return verifyExport(file, manifest ?? base.manifest, pubkey);
      };

      before(async () => {
        const exported = await exportTo('jsonl');
        base = { ...exported, text: fs.readFileSync(exported.file, 'utf8').split('\n') };
        lines = jsonl(base.file);
        assert.ok(lines.length >= 8);
      });

      it('each line is the canonical row its hash covers, with prev_hash and hash appended', async () => {
        const text = fs.readFileSync(base.file, 'utf8').trimEnd().split('\n');
        for (const [i, line] of text.entries()) {
          const tail = `,"prev_hash":"${lines[i]!.prev_hash}","hash":"${lines[i]!.hash}"}`;
          assert.ok(line.endsWith(tail));
          const hashed = `${line.slice(0, -tail.length)}}`;
          assert.equal(
            createHash('sha256').update(`${lines[i]!.prev_hash}${hashed}`).digest('hex'),
            lines[i]!.hash,
          );
        }
      });

      /** Verifies the export with line `index` (0-based) rewritten by `edit`, every other byte as exported. */
      const textEdited = async (index: number, edit: (line: string) => string) => {
        const text = fs.readFileSync(base.file, 'utf8').split('\n');
        text[index] = edit(text[index]!);
        const file = path.join(dir, `edited-${Math.random().toString(36).slice(2)}.jsonl`);
        fs.writeFileSync(file, text.join('\n'));
        return verifyExport(file, base.manifest);
      };

      it('refuses a line that is not byte for byte its row, even where the hash still holds', async () => {
        const seq = lines[4]!.seq;
        const edits: [string, (line: string) => string][] = [
          ['a field added', (l) => l.replace('{', '{"x":1,')],
          ['a field removed', (l) => l.replace(/"event_id":"[^"]*",/, '')],
          ['a null field removed', (l) => l.replace(/"[a-z_]+":null,/, '')],
          ['a field renamed', (l) => l.replace('"actor":', '"Actor":')],
          [
            'fields re-ordered',
            (l) => JSON.stringify(Object.fromEntries(Object.entries(JSON.parse(l)).reverse())),
          ],
          ['a number written another way', (l) => l.replace(`"seq":${seq}`, `"seq":${seq}.0`)],
          ['white space', (l) => l.replace('"kind":', '"kind": ')],
          ['a CR before the LF', (l) => `${l}\r`],
        ];
        for (const [what, edit] of edits) {
          assert.notEqual(edit(base.text[4]!), base.text[4], `${what}: the edit changes the line`);
          const report = await textEdited(4, edit);
          assert.equal(report.ok, false, what);
          assert.deepEqual([report.first_bad?.line, report.first_bad?.seq], [5, seq], what);
          assert.match(report.first_bad!.reason, /canonical form|hash mismatch|not a valid row/, what);
        }
        // The ones whose content still hashes are named for what they are.
        for (const edit of [edits[0]![1], edits[4]![1], edits[6]![1]]) {
          assert.match((await textEdited(4, edit)).first_bad!.reason, /not the canonical form/);
        }
      });

      it('refuses a CSV cell written another way than the exporter writes it', async () => {
        const csv = await exportTo('csv');
        const text = fs.readFileSync(csv.file, 'utf8').split('\n');
        const row = text[3]!;
        // The first cell (seq) quoted: the same value, other bytes.
        const requoted = row.replace(/^(\d+),/, '"$1",');
        assert.notEqual(requoted, row);
        const file = path.join(dir, `edited-${Math.random().toString(36).slice(2)}.csv`);
        fs.writeFileSync(file, [...text.slice(0, 3), requoted, ...text.slice(4)].join('\n'));
        const report = await verifyExport(file, csv.manifest);
        assert.equal(report.ok, false);
        assert.equal(report.first_bad?.line, 4);
        assert.match(report.first_bad!.reason, /not the canonical form/);
        assert.equal((await verifyExport(csv.file, csv.manifest)).ok, true, 'the export as written verifies');
      });

      it('one byte flipped in each field of a row: hash mismatch at that row', async () => {
        for (const field of EXPORT_COLUMNS) {
          if (field === 'seq') continue;
          const report = await tampered((ls) => {
            const row = ls[4]!;
            const v = row[field];
            row[field] =
              typeof v === 'string'
                ? v.length
                  ? (v[0] === 'a' ? 'b' : 'a') + v.slice(1)
                  : 'x'
                : typeof v === 'boolean'
                  ? !v
                  : v === null
                    ? 'x'
                    : Array.isArray(v)
                      ? [...v, 'x']
                      : { ...(v as object), tampered: 1 };
            return ls;
          });
          assert.equal(report.ok, false, field);
          assert.equal(report.first_bad?.seq, field === 'hash' ? 5 : 5, field);
          assert.equal(report.first_bad?.line, 5, field);
        }
        const seqChanged = await tampered((ls) => ((ls[4]!.seq = 99), ls));
        assert.equal(seqChanged.first_bad?.line, 5);
      });

      it('a row deleted: missing row named', async () => {
        const report = await tampered((ls) => (ls.splice(3, 1), ls));
        assert.equal(report.first_bad?.seq, 5);
        assert.match(report.first_bad!.reason, /missing row: expected seq 4/);
      });

      it('a row inserted: named', async () => {
        const report = await tampered((ls) => (ls.splice(3, 0, { ...ls[3]!, event_id: 'forged' }), ls));
        assert.equal(report.first_bad?.line, 4);
      });

      it('two rows swapped: rows out of order, at the line of the first', async () => {
        const report = await tampered((ls) => (([ls[5], ls[6]] = [ls[6]!, ls[5]!]), ls));
        assert.equal(report.first_bad?.line, 6);
        assert.match(report.first_bad!.reason, /^rows out of order at line 6: seq \d+ comes before seq \d+$/);
        assert.doesNotMatch(report.first_bad!.reason, /missing/);
      });

      it('one row taken out: a missing row, not rows out of order', async () => {
        const report = await tampered((ls) => (ls.splice(5, 1), ls));
        assert.equal(report.first_bad?.line, 6);
        assert.match(report.first_bad!.reason, /^missing row: expected seq \d+, found \d+$/);
      });

      it("the manifest's row_count edited: the manifest was altered, the rows are intact", async () => {
        const edited = { ...base.manifest, row_count: base.manifest.row_count + 1 };
        const report = await tampered((ls) => ls, edited);
        assert.equal(report.ok, false);
        assert.equal(report.signature, 'bad signature');
        assert.equal(report.valid, report.rows, 'every row holds');
        assert.match(report.first_bad!.reason, /the manifest was altered after it was signed/);
        assert.match(report.first_bad!.reason, /the rows themselves are intact/);
      });

      it('the tail truncated: truncated, with the first missing seq', async () => {
        const report = await tampered((ls) => ls.slice(0, -2));
        assert.equal(report.ok, false);
        assert.match(report.first_bad!.reason, /truncated/);
        assert.equal(report.first_bad!.seq, lines.length - 1);
      });

      it("the manifest's signature replaced: bad signature", async () => {
        const forged = {
          ...base.manifest,
          row_count: base.manifest.row_count - 2,
          signature: Buffer.alloc(64).toString('base64'),
        };
        const report = await tampered((ls) => ls.slice(0, -2), forged);
        assert.equal(report.signature, 'bad signature');
        assert.equal(report.ok, false);
      });

      it('verification with another key: unknown key', async () => {
        const other = generateKeyPairSync('ed25519')
          .publicKey.export({ format: 'pem', type: 'spki' })
          .toString();
        const report = await tampered((ls) => ls, undefined, other);
        assert.equal(report.signature, 'unknown key');
        assert.equal(report.ok, false);
        const own = await tampered((ls) => ls, undefined, server.services.checkpoints.signer.public_key);
        assert.equal(own.ok, true);
      });
    });

    it('never signs a checkpoint that contradicts the previous one', async () => {
      const before = await listCheckpoints(server.sql);
      const again = await server.services.checkpoints.checkpoint();
      assert.ok(again!.seq >= before.at(-1)!.seq);
      const all = await listCheckpoints(server.sql);
      for (let i = 1; i < all.length; i++) assert.ok(all[i]!.seq >= all[i - 1]!.seq);
      await assert.rejects(server.sql('audit_checkpoints').delete(), /append-only/);
    });

    it('exports and verifies from the command line, with exit codes', async () => {
      const file = path.join(dir, 'cli.jsonl');
      const exported = await runCli(['audit', 'export', '--format', 'jsonl', '-o', file], server.env);
      assert.equal(exported.code, 0, exported.stderr);
      const ok = await runCli(['audit', 'verify', file, ...pinArgs(server.env)], server.env);
      assert.equal(ok.code, 0, ok.stdout + ok.stderr);
      assert.match(
        ok.stdout,
        /^(\d+)\/\1 rows valid; manifest signature valid; checkpoint signature valid$/m,
      );
      const ls = jsonl(file);
      ls[2]!.tool = 'isphere_send_message';
      writeJsonl(file, ls);
      const bad = await runCli(['audit', 'verify', file, ...pinArgs(server.env)], server.env);
      assert.equal(bad.code, 1);
      assert.match(bad.stdout, /first bad \(line 3, seq 3\): hash mismatch/);
      const db = await runCli(['audit', 'verify', '--db'], server.env);
      assert.equal(db.code, 0, db.stdout + db.stderr);
      assert.match(db.stdout, /^(\d+)\/\1 rows valid; \d+ checkpoints valid/);
    });
  });
}
