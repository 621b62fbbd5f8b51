import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

/**
 * The database round trips of one write's whole cycle, counted (never timed): docs/performance.md
 * measures the cycle's machine time, and on this stack that time follows the number of round trips. Each step's
 * budget is what its one-statement path takes; a step that falls back to its transaction path (or a
 * change that adds a query) fails here before it shows in a benchmark.
 */
const BUDGET = { dry_run: 3, approve: 2, get_approval: 2, execute: 6 } as const;
/**
 * The same on both databases: on the embedded one the agent is cached too (every change to an agent
 * there is this process's own command, src/accounts/agent-cache.ts), so no MCP call reads its row.
 */
const budgetOn = (_kind: string): Counts => ({ ...BUDGET });

type Counts = Record<keyof typeof BUDGET, number>;

/** Each step's fewest statements over several cycles. */
const fewest = (runs: Counts[]): Counts =>
  Object.fromEntries(
    Object.keys(BUDGET).map((step) => [step, Math.min(...runs.map((r) => r[step as keyof Counts]))]),
  ) as Counts;

for (const kind of databaseKinds()) {
  describe(`round trips of one approval cycle on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: User;

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      chair = await createUser(server.sql, {
        name: 'chair-rt',
        roles: ['chair'],
        password: 'round trips 1',
      });
    });

    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    /** Runs `step` and returns its result with the number of statements it sent to the database. */
    async function counted<T>(step: () => Promise<T>): Promise<[T, number]> {
      let statements = 0;
      const count = () => statements++;
      server.sql.on('query', count);
      try {
        return [await step(), statements];
      } finally {
        server.sql.off('query', count);
      }
    }

    async function cycle(i: number) {
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: `round trip ${i}` };
      const [draft, dry_run] = await counted(() => call(agent, 'isphere_send_message', args));
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      const id = (draft as Envelope).approval.approval_request_id as string;
      const [view, approve] = await counted(() =>
        server.services.approvals.decide({ id, user: chair, decision: 'approve' }),
      );
      assert.equal(view.status, 'approved');
      const [got, get_approval] = await counted(() =>
        call(agent, 'isphere_get_approval', { approval_request_id: id }),
      );
      assert.equal(got.approval.approval_id, view.approval_id);
      const [sent, execute] = await counted(() =>
        call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id: view.approval_id }),
      );
      assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
      return { dry_run, approve, get_approval, execute };
    }

    it(`takes at most ${Object.values(budgetOn(kind)).reduce((a, b) => a + b)} statements: dry run, approval, get_approval, execution`, async (t) => {
      await cycle(0); // the first append learns the chain's head; from then on the short paths apply
      // The leader's own work (the checkpoint check each second, the outbox poll) shares the pool and
      // can land inside a step: it only ever adds statements, so each step's fewest over three cycles
      // is its own count, and a step that gains a statement still fails.
      const runs = [await cycle(1), await cycle(2), await cycle(3)];
      const counts = fewest(runs);
      t.diagnostic(JSON.stringify(runs));
      assert.deepEqual(counts, budgetOn(kind));
    });

    it('keeps the chain head through a change that changed nothing (a repeated draft)', async () => {
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'drafted twice' };
      const first = await call(agent, 'isphere_send_message', args);
      const again = await call(agent, 'isphere_send_message', args);
      assert.equal(again.approval.approval_request_id, first.approval.approval_request_id);
      const id = first.approval.approval_request_id as string;
      const look = async () =>
        (await counted(() => call(agent, 'isphere_get_approval', { approval_request_id: id })))[1];
      const statements = Math.min(await look(), await look(), await look()); // fewest: as above
      assert.equal(statements, budgetOn(kind).get_approval, 'the audit append after it is one statement');
    });

    it('still refuses what the short path does not take: a second execution is consumed', async () => {
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'once only' };
      const draft = await call(agent, 'isphere_send_message', args);
      const id = (draft as Envelope).approval.approval_request_id as string;
      const view = await server.services.approvals.decide({ id, user: chair, decision: 'approve' });
      const run = () =>
        call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id: view.approval_id });
      const results = await Promise.all([run(), run(), run()]);
      assert.equal(results.filter((r) => r.ok).length, 1, JSON.stringify(results.map((r) => r.error)));
      for (const r of results.filter((r) => !r.ok)) assert.equal(r.error.reason, 'consumed');
    });
  });
}
