import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { spawnServer, stopChild } from '../helpers/cli.ts';
import { describeOnPostgres } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const CHAIRS = ['ada', 'bea', 'cy', 'dee', 'eve'];
const ROUNDS = 6;

// Two server processes share only PostgreSQL; the embedded database allows one process.
describeOnPostgres('five chairs deciding one request at once, on two server processes', () => {
  let server: TestServer;
  let other: Awaited<ReturnType<typeof spawnServer>>;
  let agent: Client;
  const chairs: WebClient[] = [];

  before(async () => {
    server = await startTestServer('postgres');
    for (const name of CHAIRS) {
      await createUser(server.sql, { name, roles: ['chair'], password: `${name} password` });
    }
    other = await spawnServer(server.env);
    for (const [i, name] of CHAIRS.entries()) {
      const web = new WebClient(i % 2 === 0 ? server.url : other.url);
      await web.login(name, `${name} password`);
      chairs.push(web);
    }
    // An agent of its own: the second process's start may have re-issued the demo agent's token.
    agent = await connectHttp(server.url, await server.addAgent('drafter'));
  });
  after(async () => {
    await agent?.close();
    if (other) await stopChild(other.child);
    await server?.stop();
  });

  it('answers every racer 303 or 409, never 500, and commits every decision with its audit row', async () => {
    const knex = server.sql;
    for (let round = 0; round < ROUNDS; round++) {
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: `race round ${round}` };
      const draft = await call(agent, 'isphere_send_message', args);
      const id = draft.approval.approval_request_id as string;
      const forms = await Promise.all(chairs.map((c) => c.get(`/approvals/${id}`)));
      const answers = await Promise.all(
        chairs.map((c, i) =>
          c.post(`/approvals/${id}/decision`, {
            decision: 'approve',
            note: `chair ${i}`,
            _csrf: WebClient.field(forms[i]!.html, '_csrf'),
          }),
        ),
      );
      const statuses = answers.map((a) => a.res.status);
      assert.ok(
        statuses.every((s) => s === 303 || s === 409),
        `round ${round}: ${statuses.join(', ')}`,
      );
      assert.ok(statuses.includes(303), `round ${round}: somebody's approval took effect`);

      const decisions = (await knex('approval_decisions').where({ approval_request_id: id })) as {
        user_name: string;
      }[];
      const recorded = (await knex('audit_events')
        .where({ approval_request_id: id })
        .whereIn('kind', ['approval.approved', 'approval.rejected'])) as {
        actor: string;
        approvers: string[] | null;
      }[];
      const actors = new Set(recorded.map((r) => r.actor));
      for (const d of decisions) {
        assert.ok(actors.has(d.user_name), `round ${round}: ${d.user_name}'s decision has no audit row`);
      }
      assert.equal(recorded.length, decisions.length, `round ${round}: one audit row per decision`);

      const request = (await knex('approval_requests').where({ id }).first()) as { approval_id: string };
      const sent = await call(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: request.approval_id,
      });
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
      const started = (await knex('audit_events')
        .where({ approval_request_id: id, kind: 'write.started' })
        .first()) as { approvers: string[] };
      for (const name of started.approvers) {
        assert.ok(actors.has(name), `round ${round}: write.started names ${name}, never recorded deciding`);
      }
    }
    assert.equal((await verifyDatabaseChain(knex)).first_bad, undefined);
  });
});
