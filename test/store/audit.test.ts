import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { chainHash, GENESIS_HASH, rowFromDb, type AuditRow } from '../../src/audit/chain.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { ChainVerifier, verifyDatabaseChain } from '../../src/audit/verify.ts';
import { type Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';

for (const kind of databaseKinds()) {
  describe(`audit_events on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    it('chains concurrent appends with strictly increasing seq and no gaps', async () => {
      const log = createAuditLog(db.knex, { maxBatch: 16 });
      const rows = await Promise.all(
        Array.from({ length: 100 }, (_, i) =>
          log.append({ kind: 'tool.call', tool: 'isphere_search_contacts', result: 'ok', details: { i } }),
        ),
      );
      const seqs = rows.map((r) => r.seq).sort((a, b) => a - b);
      assert.deepEqual(
        seqs,
        Array.from({ length: 100 }, (_, i) => seqs[0]! + i),
      );
      const report = await verifyDatabaseChain(db.knex);
      assert.equal(report.first_bad, undefined);
      assert.equal(report.valid, 100);
      assert.equal(report.head_seq, seqs.at(-1));
    });

    it('stores rows that hash exactly as they were chained (round trip through the database)', async () => {
      const log = createAuditLog(db.knex);
      const written = await log.append({
        kind: 'auth.denied',
        agent_id: null,
        approvers: ['chair-1', 'chair-2'],
        dry_run: true,
        details: { reason: 'unknown_token', nested: { ünï: '中文', n: 3 } },
      });
      const stored = rowFromDb(
        (await db.knex('audit_events').where('seq', written.seq).first()) as Record<string, unknown>,
      );
      assert.deepEqual(stored, written);
      assert.equal(chainHash(stored.prev_hash, stored), stored.hash);
    });

    it('stores a row appended alone after a known head (its fields bound one by one) as a batch stores it', async () => {
      const log = createAuditLog(db.knex);
      await log.append({ kind: 'tool.call', result: 'ok' }); // the head this log then knows
      const input = {
        kind: 'tool.call' as const,
        agent_id: 'agent-1',
        tool: 'fs__read_text_file',
        approvers: ['chair-1', 'chair "2"'],
        dry_run: false,
        result: 'ok' as const,
        details: {
          quote: 'a"b\\c\n',
          nested: { ünï: '中文', n: 3.5, big: 1e21, none: null },
          list: [1, 'x'],
        },
      };
      // The one-statement appends, told apart by how the rows travel: bound fields, or a JSON array.
      const statements: string[] = [];
      const seen = ({ sql }: { sql: string }) =>
        statements.push(sql.includes('json_populate_recordset') ? 'json array' : 'bound fields');
      db.knex.on('query', seen);
      let alone, batch;
      try {
        alone = await log.append(input);
        batch = await Promise.all([log.append(input), log.append({ ...input, dry_run: null })]);
      } finally {
        db.knex.off('query', seen);
      }
      assert.deepEqual(statements, ['bound fields', 'json array']);
      for (const written of [alone, ...batch]) {
        const stored = rowFromDb(
          (await db.knex('audit_events').where('seq', written.seq).first()) as Record<string, unknown>,
        );
        assert.deepEqual(stored, written);
        assert.equal(chainHash(stored.prev_hash, stored), stored.hash);
      }
    });

    for (const [what, sql] of [
      ['UPDATE', "update audit_events set result = 'ok'"],
      ['DELETE', 'delete from audit_events where seq = 1'],
      ['TRUNCATE', 'truncate audit_events'],
    ] as const) {
      it(`refuses ${what}`, async () => {
        await assert.rejects(db.knex.raw(sql), /append-only/);
        const report = await verifyDatabaseChain(db.knex);
        assert.equal(report.first_bad, undefined);
      });
    }
  });
}

describe('the chain verifier', () => {
  function chain(n: number): AuditRow[] {
    const rows: AuditRow[] = [];
    let prev = GENESIS_HASH;
    for (let i = 1; i <= n; i++) {
      const body = {
        seq: i,
        event_id: `00000000-0000-4000-8000-${String(i).padStart(12, '0')}`,
        ts: new Date(Date.UTC(2026, 10, 30, 0, 0, i)).toISOString(),
        kind: 'tool.call' as const,
        request_id: null,
        trace_id: null,
        agent_id: 'agent',
        actor: null,
        tool: 'isphere_search_contacts',
        source: 'local',
        target_type: null,
        target_ref: null,
        approval_request_id: null,
        approval_id: null,
        approvers: null,
        dry_run: false,
        content_sha256: null,
        file_sha256: null,
        result: 'ok' as const,
        error_code: null,
        details: { i },
      };
      const hash = chainHash(prev, body);
      rows.push({ ...body, prev_hash: prev, hash });
      prev = hash;
    }
    return rows;
  }
  const verify = (rows: AuditRow[]) => {
    const v = new ChainVerifier();
    for (const r of rows) v.push(r);
    return v.report;
  };

  it('accepts an intact chain', () => {
    const report = verify(chain(10));
    assert.equal(report.valid, 10);
    assert.equal(report.first_bad, undefined);
  });

  it('locates an edited field, a deleted row, an inserted row and a swap', () => {
    const edited = chain(10);
    edited[4] = { ...edited[4]!, tool: 'isphere_send_message' };
    assert.deepEqual(verify(edited).first_bad?.seq, 5);
    assert.equal(verify(edited).first_bad?.fault, 'hash_mismatch');

    const deleted = chain(10);
    deleted.splice(3, 1);
    assert.equal(verify(deleted).first_bad?.fault, 'gap');
    assert.equal(verify(deleted).first_bad?.seq, 5);

    const swapped = chain(10);
    [swapped[6], swapped[7]] = [swapped[7]!, swapped[6]!];
    assert.equal(verify(swapped).first_bad?.seq, 8);
    assert.equal(verify(swapped).first_bad?.fault, 'gap');

    const inserted = chain(10);
    const extra = {
      ...inserted[3]!,
      event_id: '00000000-0000-4000-8000-999999999999',
      details: { forged: true },
    };
    extra.hash = chainHash(extra.prev_hash, extra);
    inserted.splice(3, 0, extra);
    assert.equal(verify(inserted).first_bad?.seq, 4);
    assert.equal(verify(inserted).first_bad?.fault, 'reordered');

    const rehashed = chain(10);
    // A forger who edits a row and recomputes its hash still breaks the next link.
    const forged = { ...rehashed[2]!, result: 'error' as const };
    forged.hash = chainHash(forged.prev_hash, forged);
    rehashed[2] = forged;
    assert.equal(verify(rehashed).first_bad?.seq, 4);
    assert.equal(verify(rehashed).first_bad?.fault, 'prev_hash_mismatch');
  });
});
