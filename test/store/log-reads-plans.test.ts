import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { PGlite } from '@electric-sql/pglite';
import { AGENT_SUPERSEDED, USER_SUPERSEDED } from '../../src/accounts/store/sql.ts';
import { POLICY_LAST_CHANGE_SQL } from '../../src/approval/rules/store.ts';

/**
 * The reads of the log that ride on every authentication and policy read (a record's freshness, an
 * agent's revocation, the policy's last change) must find their few rows by the (kind, seq) index,
 * whatever the statistics: PGlite never runs ANALYZE (no autovacuum in its single-user backend), and
 * without statistics the planner took the (agent_id, seq) index for an agent's freshness — every call
 * the agent ever made, a scan that grew with the log and halved PGlite's throughput in bench (h).
 * Checked here on a log of 100,000 calls by one agent, with the plans PGlite makes of the real SQL.
 */
describe('the plans PGlite makes of the log reads', () => {
  let db: PGlite;
  const AGENT = '00000000-0000-4000-8000-000000000001';

  before(async () => {
    db = new PGlite();
    await db.exec(`
    create table audit_events (seq bigint primary key, kind text not null, agent_id text,
      details jsonb not null default '{}');
    create index audit_events_agent_id_seq_index on audit_events (agent_id, seq);
    create index audit_events_kind_seq_index on audit_events (kind, seq);
    create table agents (id uuid primary key, sealed_seq bigint);
    create table users (id uuid primary key, name text, sealed_seq bigint);
    insert into agents values ('${AGENT}', 5);
    insert into users values (gen_random_uuid(), 'ada', 5);
    insert into audit_events
      select g, case when g = 5 then 'agent.created' else 'tool.call' end, '${AGENT}',
        case when g = 5 then '{"user": "ada"}'::jsonb else '{}'::jsonb end
      from generate_series(1, 100000) g;`);
  });
  after(async () => db?.close());

  const plan = async (sql: string) =>
    ((await db.query<{ 'QUERY PLAN': string }>(`explain ${sql}`)).rows ?? [])
      .map((r) => r['QUERY PLAN'])
      .join('\n');

  for (const [what, sql] of [
    ["an agent's freshness", `select ${AGENT_SUPERSEDED()} from agents`],
    ["a user's freshness", `select ${USER_SUPERSEDED()} from users`],
    ["the policy's last change", POLICY_LAST_CHANGE_SQL],
  ] as const) {
    it(`reads ${what} from the log by the (kind, seq) index, without statistics`, async () => {
      const shown = await plan(sql);
      assert.match(shown, /audit_events_kind_seq_index/, shown);
      assert.doesNotMatch(shown, /audit_events_agent_id_seq_index|Seq Scan on audit_events/, shown);
    });
  }

  it('would take the agent index for the plain comparison: the check above can fail', async () => {
    const plain = `select exists (select 1 from audit_events e where e.agent_id = agents.id::text
    and e.seq > coalesce(agents.sealed_seq, 0) and e.kind in ('agent.created', 'agent.revoked')) from agents`;
    assert.match(await plan(plain), /audit_events_agent_id_seq_index/);
  });
});
