import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { approveAsChair, type Chair } from '../helpers/approvals.ts';
import { spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds } from '../helpers/db.ts';
import { startHostileUpstream, type HostileUpstream } from '../helpers/hostile-upstream.ts';
import {
  call,
  connectHttp,
  ROOT,
  startTestServer,
  testEnv,
  type TestServer,
  waitFor,
} from '../helpers/server.ts';

/** The cap every hostile upstream here is configured with (the default is 8 MiB). */
const CAP = 16_384;
/** The case: 34 characters that kept a backtracking engine busy for 85 s (more: far longer). */
const HOSTILE = 'a'.repeat(33) + '!';
const HOSTILE_STDIO = [path.join(ROOT, 'test/helpers/hostile-upstream.ts'), 'stdio'];

for (const kind of databaseKinds()) {
  describe(`hostile upstreams on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: Chair;
    let sse: HostileUpstream;
    let json: HostileUpstream;
    let configFile: string;

    before(async () => {
      sse = await startHostileUpstream();
      json = await startHostileUpstream({ json: true });
      configFile = path.join(os.tmpdir(), `countersign-hostile-${process.pid}-${kind}.json`);
      fs.writeFileSync(
        configFile,
        JSON.stringify({
          upstreams: [
            { name: 'sse', url: sse.url, max_result_bytes: CAP },
            { name: 'json', url: json.url, max_result_bytes: CAP },
            {
              name: 'pipe',
              command: process.execPath,
              args: ['--import', 'tsx', ...HOSTILE_STDIO],
              cwd: ROOT,
              max_result_bytes: CAP,
            },
          ],
        }),
      );
      server = await startTestServer(kind, { COUNTERSIGN_CONFIG: configFile });
      const chairAda = await createUser(server.sql, {
        name: 'chair-ada',
        roles: ['chair'],
        password: 'correct horse 1',
      });
      chair = { approvals: server.services.approvals, user: chairAda };
      agent = await connectHttp(server.url, server.demoToken);
      await waitFor('the hostile upstreams to be listed', async () => {
        const names = (await agent.listTools()).tools.map((t) => t.name);
        return ['sse__match', 'json__big', 'pipe__big'].every((n) => names.includes(n)) || undefined;
      });
    });

    after(async () => {
      await agent?.close();
      await server?.stop();
      await Promise.all([sse?.close(), json?.close()]);
      fs.rmSync(configFile, { force: true });
    });

    // Bounded by the test's own timeout, not by a measured duration: a backtracking engine takes about
    // 85 s on HOSTILE and doubles that for every further "a", so on LONGER it would never answer, on any
    // machine; RE2 answers both in milliseconds, and the concurrent read is answered beside them.
    it(
      "checks an upstream's pattern in linear time: refused, and a concurrent read answered",
      { timeout: 60_000 },
      async () => {
        const LONGER = 'a'.repeat(10_000) + '!';
        const [hostile, longer, ping] = await Promise.all([
          call(agent, 'sse__match', { s: HOSTILE }),
          call(agent, 'sse__match', { s: LONGER }),
          call(agent, 'sse__ping'),
        ]);
        assert.equal(hostile.error?.code, 'INVALID_ARGUMENT');
        assert.equal(longer.error?.code, 'INVALID_ARGUMENT');
        assert.equal(ping.ok, true, JSON.stringify(ping.error));
        assert.equal(ping.content[0].text, 'pong');
        // The pattern is still checked: a string that matches it passes through.
        const fine = await call(agent, 'sse__match', { s: 'aaaa' });
        assert.equal(fine.ok, true, JSON.stringify(fine.error));
        assert.equal(fine.content[0].text, 'aaaa');
        // Each pattern is its own: another tool's is checked against its own schema, not this one's.
        const digits = await call(agent, 'sse__digits', { s: '2026' });
        assert.equal(digits.ok, true, JSON.stringify(digits.error));
        assert.equal((await call(agent, 'sse__digits', { s: 'aaaa' })).error?.code, 'INVALID_ARGUMENT');
        assert.equal((await call(agent, 'sse__match', { s: '2026' })).error?.code, 'INVALID_ARGUMENT');
      },
    );

    for (const upstream of ['sse', 'json', 'pipe']) {
      it(`drops an answer past max_result_bytes from ${upstream}: CONNECTOR_FAILED result_too_large, audited`, async () => {
        const small = await call(agent, `${upstream}__big`, { bytes: CAP / 4 });
        assert.equal(small.ok, true, JSON.stringify(small.error));
        assert.equal(small.content[0].text.length, CAP / 4);

        const big = await call(agent, `${upstream}__big`, { bytes: CAP * 64 });
        assert.deepEqual([big.error?.code, big.error?.reason], ['CONNECTOR_FAILED', 'result_too_large']);
        const row = await server.sql('audit_events').where({ seq: big.audit.audit_seq }).first();
        assert.deepEqual(
          [row.tool, row.result, row.error_code],
          [`${upstream}__big`, 'error', 'CONNECTOR_FAILED'],
        );
        const details = (typeof row.details === 'string' ? JSON.parse(row.details) : row.details) as {
          reason?: string;
        };
        assert.equal(details.reason, 'result_too_large');

        // The process and the upstream are still there (a stdio upstream is reconnected).
        const ping = await waitFor('the upstream to answer again', async () => {
          const res = await call(agent, `${upstream}__ping`);
          return res.ok ? res : undefined;
        });
        assert.equal(ping.content[0].text, 'pong');
      });
    }

    it('leaves a too-large answer to an approved write to reconciliation, never recorded as failed', async () => {
      const args = { bytes: CAP * 64 };
      const draft = await call(agent, 'sse__big_write', args);
      assert.equal(draft.dry_run, true);
      const approvalId = await approveAsChair(chair, draft);
      const done = await call(agent, 'sse__big_write', { ...args, dry_run: false, approval_id: approvalId });
      assert.deepEqual([done.error?.code, done.error?.reason], ['CONNECTOR_FAILED', 'result_too_large']);
      assert.deepEqual(sse.writes, [args.bytes], 'the upstream wrote, once');
      const request = await server
        .sql('approval_requests')
        .where({ id: draft.approval.approval_request_id })
        .first();
      assert.ok(['executing', 'unknown'].includes(request.status), request.status);
      const kinds = (
        (await server
          .sql('audit_events')
          .where({ approval_id: approvalId })
          .whereLike('kind', 'write.%')
          .select('kind')) as { kind: string }[]
      ).map((r) => r.kind);
      assert.ok(kinds.includes('write.started'), kinds.join());
      assert.ok(!kinds.includes('write.failed'), kinds.join());
    });
  });
}

describe('start-up after a crash', () => {
  it('clears a lock and an admin.json left by a process that is gone, with a warning', async () => {
    const db = await createTestDatabase('pglite');
    // A pid that was just used and is now free: a process that ran and exited.
    const dead = spawnSync(process.execPath, ['-e', '0']).pid;
    const pgliteDir = path.join(db.dataDir, 'pglite');
    fs.mkdirSync(pgliteDir, { recursive: true });
    const lockFile = path.join(pgliteDir, 'countersign.lock');
    const adminFile = path.join(db.dataDir, 'admin.json');
    fs.writeFileSync(
      lockFile,
      JSON.stringify({
        pid: dead,
        hostname: os.hostname(),
        command: 'countersign serve',
        started_at: '2026-01-01T00:00:00Z',
      }),
    );
    fs.writeFileSync(
      adminFile,
      JSON.stringify({ pid: dead, url: 'http://127.0.0.1:9/admin', secret: 'old' }),
    );
    const server = await spawnServer(testEnv(db));
    try {
      const pid = server.child.pid!;
      assert.equal(JSON.parse(fs.readFileSync(lockFile, 'utf8')).pid, pid);
      assert.equal(JSON.parse(fs.readFileSync(adminFile, 'utf8')).pid, pid);
      const warnings = server
        .stderr()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      assert.ok(warnings.some((w) => (w.stale_lock as { pid?: number } | undefined)?.pid === dead));
      assert.ok(warnings.some((w) => w.stale_admin_pid === dead));
    } finally {
      await stopChild(server.child);
      await db.drop();
    }
  });
});
