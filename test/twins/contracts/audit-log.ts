import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { AuditLog } from '../../../src/audit/index.ts';
import { chainHash, type AuditRow } from '../../../src/audit/chain.ts';

/**
 * What the seam asks of the audit log (append and the head), held for the real log (test/store/) and
 * its twin (test/unit/): rows chained one after the other, announced with the seq they commit under,
 * stored as given.
 */
export function auditLogContract(name: string, open: () => Promise<AuditLog>) {
  describe(`the audit log contract: ${name}`, () => {
    it('appends rows one after the other, each linked to the one before, and moves the head', async () => {
      const log = await open();
      const head = await log.headSeq();
      const a = await log.append({
        kind: 'tool.call',
        tool: 'a',
        result: 'ok',
        details: { agent_name: 'x' },
      });
      const b = await log.append({
        kind: 'tool.call',
        tool: 'b',
        result: 'ok',
        details: { agent_name: 'x' },
      });
      assert.deepEqual([a.seq, b.seq], [head + 1, head + 2]);
      assert.equal(b.prev_hash, a.hash);
      for (const row of [a, b]) assert.equal(row.hash, chainHash(row.prev_hash, row));
      assert.equal(await log.headSeq(), b.seq);
      assert.deepEqual(log.appended().committed, { seq: b.seq, hash: b.hash });
    });

    it('announces a row with the seq and hash it commits under', async () => {
      const log = await open();
      let announced: AuditRow | undefined;
      const row = await log.append({ kind: 'tool.call', tool: 'c', result: 'ok' }, (r) => (announced = r));
      if (announced) assert.deepEqual([announced.seq, announced.hash], [row.seq, row.hash]);
    });

    it('stores the input as given: unset columns null, details as they were', async () => {
      const log = await open();
      const row = await log.append({
        kind: 'auth.denied',
        request_id: 'r-1',
        agent_id: null,
        tool: 'isphere_send_message',
        result: 'error',
        error_code: 'TOOL_DENIED',
        details: { facet: 'send', nested: { a: [1, 'two'] }, agent_name: 'x' },
      });
      const { seq: _s, event_id, ts, prev_hash: _p, hash: _h, ...body } = row;
      assert.match(event_id, /^[0-9a-f-]{36}$/);
      assert.ok(Number.isFinite(Date.parse(ts)));
      assert.deepEqual(body, {
        kind: 'auth.denied',
        request_id: 'r-1',
        trace_id: null,
        agent_id: null,
        actor: null,
        tool: 'isphere_send_message',
        source: null,
        target_type: null,
        target_ref: null,
        approval_request_id: null,
        approval_id: null,
        approvers: null,
        dry_run: null,
        content_sha256: null,
        file_sha256: null,
        result: 'error',
        error_code: 'TOOL_DENIED',
        details: { facet: 'send', nested: { a: [1, 'two'] }, agent_name: 'x' },
      });
    });

    it('refuses a row of a kind the log does not know, and appends nothing', async () => {
      const log = await open();
      const head = await log.headSeq();
      await assert.rejects(log.append({ kind: 'no.such.kind' as 'tool.call' }));
      assert.equal(await log.headSeq(), head);
    });
  });
}
