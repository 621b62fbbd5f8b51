import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { openDatabase, type Database } from '../../src/db/knex.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, testEnv, waitFor, type Envelope } from '../helpers/server.ts';

const REPLICAS = 3;

const policyOf = (approvers: number) => ({
  rules: [
    { name: `Alice needs ${approvers}`, when: 'target.id == "ct_alice"', then: { require: { approvers } } },
  ],
});

// Several processes can share only PostgreSQL; the embedded database allows one process.
describeOnPostgres(`the approval policy across ${REPLICAS} replicas on one PostgreSQL`, () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  let direct: Database;
  let dir: string;
  let replicas: Awaited<ReturnType<typeof spawnServer>>[] = [];
  const clients: Client[] = [];
  const cli = async (args: string[], extra: Record<string, string> = {}) => {
    const res = await runCli(args, { ...env, ...extra });
    assert.equal(res.code, 0, res.stderr);
    return res.stdout;
  };
  const setPolicy = async (doc: unknown) => {
    const file = path.join(dir, `policy-${Date.now()}-${Math.random()}.json`);
    fs.writeFileSync(file, JSON.stringify(doc));
    return /version ([0-9a-f]{64})/.exec(await cli(['policy', 'set', file]))![1]!;
  };
  const draftOn = (client: Client, content_text: string) =>
    call(client, 'isphere_send_message', { target_type: 'contact', target_id: 'ct_alice', content_text });
  const versionOf = async (res: Envelope) => {
    assert.equal(res.ok, true, JSON.stringify(res.error));
    const row = await direct
      .knex('approval_requests')
      .where({ id: res.approval.approval_request_id })
      .first();
    return row.policy_version as string;
  };

  before(async () => {
    db = await createTestDatabase('postgres');
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-cluster-policy-'));
    env = testEnv(db, { COUNTERSIGN_DEMO: 'false' });
    await cli(['demo']);
    const chair = await runCli(['user', 'add', 'chair-po', '--role', 'chair'], env, {
      input: 'policy chair pw\n',
    });
    assert.equal(chair.code, 0, chair.stderr);
    replicas = await Promise.all(Array.from({ length: REPLICAS }, () => spawnServer(env)));
    direct = await openDatabase({ url: db.url, pgliteDir: '', command: 'test' });
    const token = (await cli(['agent', 'add', 'policy-agent'])).trim().split('\n').at(-1)!;
    for (const r of replicas) clients.push(await connectHttp(r.url, token));
  });
  after(async () => {
    await Promise.allSettled(clients.map((c) => c.close()));
    await Promise.allSettled(replicas.map((r) => stopChild(r.child)));
    await direct?.close();
    await db?.drop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('every replica applies the version stored by one edit', async () => {
    const version = await setPolicy(policyOf(2));
    for (const [i, client] of clients.entries()) {
      let n = 0;
      // A replica reads the stored policy again at most a second after it last did.
      const seen = await waitFor(`replica ${i} applying ${version}`, async () => {
        const v = await versionOf(await draftOn(client, `probe ${i} ${n++}`));
        return v === version ? v : undefined;
      });
      assert.equal(seen, version);
    }
  });

  it('an approval executed on another replica right after a stricter edit is refused and waits again', async () => {
    await setPolicy(policyOf(1));
    const chair = { env, name: 'chair-po', password: 'policy chair pw' };
    // Drafted under the one-approver policy, wherever it landed.
    let draft: Envelope;
    let n = 0;
    const one = (await direct.knex('settings').where({ name: 'approval_policy' }).first()).value
      .version as string;
    await waitFor('a draft under the one-approver policy', async () => {
      draft = await draftOn(clients[0]!, `strict after approval ${n++}`);
      return (await versionOf(draft)) === one ? true : undefined;
    });
    const approvalId = await approveAsChair(chair, draft!);
    await setPolicy(policyOf(2));
    const refused = await call(clients[1]!, 'isphere_send_message', {
      target_type: 'contact',
      target_id: 'ct_alice',
      content_text: `strict after approval ${n - 1}`,
      dry_run: false,
      approval_id: approvalId,
    });
    assert.deepEqual(
      [refused.ok, refused.error?.code, refused.error?.reason],
      [false, 'APPROVAL_REQUIRED', 'policy_changed'],
    );
    const row = await direct
      .knex('approval_requests')
      .where({ id: draft!.approval.approval_request_id })
      .first();
    assert.deepEqual([row.status, row.required_approvers], ['pending', 2]);
  });
});
