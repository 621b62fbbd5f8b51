import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { databaseKinds } from '../helpers/db.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { runCli } from '../helpers/cli.ts';
import { connectStdio, testEnv, waitFor } from '../helpers/server.ts';

/**
 * A stdio server's refused tokens (docs/audit.md): a refused start says why and exits, with its row
 * committed first; a token revoked while it serves is refused on each request and counted as HTTP
 * counts refusals. Apart from test/e2e/stdio.test.ts so that the two run side by side.
 */
interface Exported {
  seq: number;
  kind: string;
  agent_id: string | null;
  error_code: string | null;
  details: Record<string, unknown>;
}

/** The whole log, read through an export (what compliance gets). */
async function exported(env: Record<string, string>, dir: string): Promise<Exported[]> {
  const file = path.join(dir, `stdio-${Date.now()}.jsonl`);
  const res = await runCli(['audit', 'export', '-o', file], env);
  assert.equal(res.code, 0, res.stderr);
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Exported);
}

/** The auth.denied rows for `reason` after `sinceSeq`, and the summaries that count more of them. */
function refusalsOf(rows: Exported[], reason: string, sinceSeq = 0) {
  const later = rows.filter((r) => r.seq > sinceSeq);
  const own = later.filter((r) => r.kind === 'auth.denied' && r.details.reason === reason);
  const summaries = later.filter(
    (r) =>
      r.kind === 'auth.denied_summary' && r.details.of_kind === 'auth.denied' && r.details.reason === reason,
  );
  return { own, summaries, summed: summaries.reduce((n, r) => n + Number(r.details.count), 0) };
}

/** The source a stdio server's refusals are counted under: its process, `stdio:<pid>@<host>` (docs/audit.md). */
const assertStdioSource = (ip: unknown) =>
  assert.ok(/^stdio:\d+@/.test(String(ip)) && String(ip).endsWith(`@${os.hostname()}`), String(ip));

for (const kind of databaseKinds()) {
  describe(`a stdio server's refused tokens on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;

    before(async () => {
      db = await createTestDatabase(kind);
      env = testEnv(db, { COUNTERSIGN_DEMO: 'false' });
      assert.equal((await runCli(['demo'], env)).code, 0);
    });
    after(async () => db?.drop());

    it('exits non-zero with a clear message for a bad token', async () => {
      const res = await runCli(['serve', '--stdio'], { ...env, COUNTERSIGN_AGENT_TOKEN: 'cs_wrong' });
      assert.equal(res.code, 1);
      assert.match(res.stderr, /COUNTERSIGN_AGENT_TOKEN refused: unknown token/);
      assert.equal(res.stdout, '');
      const none = await runCli(['serve', '--stdio'], env);
      assert.equal(none.code, 1);
      assert.match(none.stderr, /missing token/);
    });

    it('records a refused start as HTTP records a refused request, committed before the process exits', async () => {
      const before = (await exported(env, db.dataDir)).at(-1)!.seq;
      const res = await runCli(['serve', '--stdio', '--no-web'], {
        ...env,
        COUNTERSIGN_AGENT_TOKEN: 'cs_wrong',
      });
      assert.equal(res.code, 1);
      const { own, summaries } = refusalsOf(await exported(env, db.dataDir), 'unknown_token', before);
      assert.equal(own.length, 1);
      assert.equal(summaries.length, 0);
      const [row] = own;
      assert.equal(row!.error_code, 'UNAUTHENTICATED');
      assert.equal(row!.agent_id, null);
      assert.deepEqual(Object.keys(row!.details).sort(), ['ip', 'reason', 'transport']);
      assert.equal(row!.details.transport, 'stdio');
      assertStdioSource(row!.details.ip);
    });

    it("counts a revoked token's refusals as HTTP does: a few rows a minute, the rest in a summary", async () => {
      const [perMinute, calls] = [3, 25];
      const added = await runCli(['agent', 'add', 'soon-revoked'], env);
      assert.equal(added.code, 0, added.stderr);
      const revokedToken = added.stdout.trim().split('\n').at(-1)!;
      const before = (await exported(env, db.dataDir)).at(-1)!.seq;
      const { client, exited } = await connectStdio({
        ...env,
        COUNTERSIGN_AGENT_TOKEN: revokedToken,
        COUNTERSIGN_DENIED_ROWS_PER_MINUTE: String(perMinute),
      });
      const refused = /agent token refused: revoked_token/;
      let answered = 0;
      try {
        assert.equal((await runCli(['agent', 'revoke', 'soon-revoked'], env)).code, 0);
        // On PostgreSQL the server hears of the revocation through the database, a moment later.
        await waitFor('the revocation to take effect', () =>
          client.listTools().then(
            () => undefined,
            (err: Error) => {
              assert.match(err.message, refused);
              return ++answered;
            },
          ),
        );
        for (; answered < calls; answered++) await assert.rejects(client.listTools(), refused);
      } finally {
        await client.close(); // a clean stop writes the open minute's summary
      }
      await exited();

      const t = refusalsOf(await exported(env, db.dataDir), 'revoked_token', before);
      assert.equal(t.own.length + t.summed, calls, 'every refusal counted');
      const minutes = new Set(t.summaries.map((r) => r.details.minute_start));
      assert.ok(t.own.length <= perMinute * Math.max(1, minutes.size), `${t.own.length} own rows`);
      assert.ok(t.summaries.length >= 1, 'the rest summed');
      for (const row of t.own) {
        assert.equal(row.error_code, 'UNAUTHENTICATED');
        assert.equal(row.details.transport, 'stdio');
        assert.equal(row.details.agent_name, 'soon-revoked');
        assert.ok(row.agent_id);
      }
      // One source for this process: its own rows and its summaries name the same one.
      const sources = new Set([...t.own, ...t.summaries].map((r) => r.details.ip));
      assert.equal(sources.size, 1);
      assertStdioSource([...sources][0]);
      for (const s of t.summaries) assert.equal(s.details.rows_per_minute, perMinute);
    });
  });
}
