import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { isAppError } from '../../src/core/errors.ts';
import type { User } from '../../src/core/identity.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const ROUNDS = 12;

for (const kind of databaseKinds()) {
  describe(`approvals counted where they commit, on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    const chairs: User[] = [];

    before(async () => {
      // A message needs two approvers: three chairs approving at once always make it approved.
      server = await startTestServer(kind, { COUNTERSIGN_REQUIRED_APPROVERS: 'send_message=2' });
      agent = await connectHttp(server.url, server.demoToken);
      for (const name of ['count-ada', 'count-bea', 'count-cy']) {
        chairs.push(await createUser(server.sql, { name, roles: ['chair'], password: `${name} pw 1` }));
      }
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it('approves a "2 approvers" request that three chairs approve at the same moment, every round', async () => {
      const knex = server.sql;
      for (let round = 0; round < ROUNDS; round++) {
        const args = { target_type: 'contact', target_id: 'ct_david', content_text: `count round ${round}` };
        const draft = await call(agent, 'isphere_send_message', args);
        const id = draft.approval.approval_request_id as string;
        assert.equal(draft.approval.status, 'pending');
        // Each decision in its own connection and transaction, all sent before any is answered.
        const answers = await Promise.allSettled(
          chairs.map((user) => server.services.approvals.decide({ id, user, decision: 'approve' })),
        );
        for (const a of answers) {
          // A chair coming after the request was approved is told so: CONFLICT, not_pending.
          if (a.status === 'rejected')
            assert.ok(isAppError(a.reason, 'CONFLICT', 'not_pending'), String(a.reason));
        }
        const row = await knex('approval_requests').where({ id }).first();
        assert.equal(row.status, 'approved', `round ${round}: ${row.status}`);
        assert.ok(row.approval_id);
        const rows = await knex('audit_events').where({ approval_request_id: id, kind: 'approval.approved' });
        const finals = rows.filter((r) => detailsOf(r).final === true);
        assert.equal(finals.length, 1, `round ${round}: one decision completes the count`);
        assert.equal(finals[0].approval_id, row.approval_id);
        // Every decision committed is audited, and the one that saw enough approvals said final.
        const decisions = await knex('approval_decisions').where({ approval_request_id: id });
        assert.equal(decisions.length, rows.length);
        assert.ok(decisions.length >= 2);
      }
      assert.equal((await verifyDatabaseChain(knex)).first_bad, undefined);
    });
  });
}
