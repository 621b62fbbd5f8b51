import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import type { Knex } from 'knex';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * A fixed script of calls — a read, a draft approved and executed, the approval used again, a draft
 * under other content, a rejected draft, an unknown tool, the agent's reads of its approvals — and the
 * audit rows it leaves, compared with test/__snapshots__/audit-script.<database>.json. Only what differs
 * from run to run is replaced (times, ids, hashes of the chain, the process, the data directory), ids
 * by the order they first appear, so that which row names which request stays compared. A change of
 * behaviour anywhere on the path of a call (a row more or less, a field, a code, an order) fails here;
 * regenerate with UPDATE_SNAPSHOTS=1 only for a change meant to alter the log, and review the diff.
 */

const SNAPSHOT = (kind: string) => new URL(`../__snapshots__/audit-script.${kind}.json`, import.meta.url);

const MESSAGE = { target_type: 'contact', target_id: 'ct_alice', content_text: 'The minutes are attached.' };

/** Columns and details that are this run's own: replaced by their name. */
const PER_RUN = new Set([
  'ts',
  'created_at',
  'prev_hash',
  'row_hash',
  'hash',
  'row_mac',
  'started_at',
  'expires_at',
  'decided_at',
  'pid',
  'host',
  'hostname',
  'web',
  'url',
  'review_url',
  'data_dir',
  'config_sha256',
  'signing_key_id',
  'key_id',
  'duration_ms',
  'uptime_s',
  'version',
  'node',
  'trace_id',
  // A hash over arguments that hold this run's approval_id.
  'args_sha256',
]);

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g;

/** The rows with this run's own values replaced; each id by its place among the ids first seen. */
function normalized(rows: Record<string, unknown>[]): unknown[] {
  const ids = new Map<string, string>();
  const id = (u: string) => {
    if (!ids.has(u)) ids.set(u, `<id ${ids.size + 1}>`);
    return ids.get(u)!;
  };
  const walk = (value: unknown, key?: string): unknown => {
    if (key !== undefined && PER_RUN.has(key) && value !== null) return `<${key}>`;
    if (typeof value === 'string') return value.replace(UUID, id);
    if (Array.isArray(value)) return value.map((v) => walk(v));
    if (value && typeof value === 'object')
      return Object.fromEntries(
        Object.entries(value as Record<string, unknown>)
          .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
          .map(([k, v]) => [k, walk(v, k)]),
      );
    return value;
  };
  return rows.map((r) => walk(r));
}

async function auditRows(sql: Knex): Promise<Record<string, unknown>[]> {
  const rows = (await sql('audit_events').orderBy('seq')) as Record<string, unknown>[];
  return rows.map((r) => ({
    ...r,
    details: typeof r.details === 'string' ? (JSON.parse(r.details) as unknown) : r.details,
  }));
}

for (const kind of databaseKinds()) {
  describe(`the audit rows of a fixed script of calls on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: User;

    before(async () => {
      server = await startTestServer(kind);
      chair = await createUser(server.sql, {
        name: 'chair-ada',
        roles: ['chair'],
        password: 'correct horse 1',
      });
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it('leaves the same rows as the snapshot, apart from what is this run’s own', async () => {
      await call(agent, 'isphere_search_contacts', { query: 'alice' });
      const draft = await call(agent, 'isphere_send_message', MESSAGE);
      const request = draft.approval.approval_request_id as string;
      const approved = await server.services.approvals.decide({
        id: request,
        user: chair,
        decision: 'approve',
      });
      const approval_id = approved.approval_id!;
      await call(agent, 'isphere_send_message', { ...MESSAGE, dry_run: false, approval_id });
      await call(agent, 'isphere_send_message', { ...MESSAGE, dry_run: false, approval_id });
      await call(agent, 'isphere_send_message', {
        ...MESSAGE,
        content_text: 'Other minutes.',
        dry_run: false,
        approval_id,
      });
      await call(agent, 'isphere_get_approval', { approval_request_id: request });
      const other = await call(agent, 'isphere_send_message', { ...MESSAGE, content_text: 'Not this one.' });
      await server.services.approvals.decide({
        id: other.approval.approval_request_id as string,
        user: chair,
        decision: 'reject',
        note: 'not today',
      });
      await call(agent, 'isphere_list_approvals', {});
      await call(agent, 'isphere_send_mesage', MESSAGE).catch(() => undefined);

      const rows = normalized(await auditRows(server.sql));
      const file = SNAPSHOT(kind);
      if (process.env.UPDATE_SNAPSHOTS === '1') fs.writeFileSync(file, `${JSON.stringify(rows, null, 2)}\n`);
      assert.ok(fs.existsSync(file), 'no snapshot yet: run with UPDATE_SNAPSHOTS=1');
      assert.deepEqual(rows, JSON.parse(fs.readFileSync(file, 'utf8')));
    });
  });
}
