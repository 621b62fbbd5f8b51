import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import type { Knex } from 'knex';
import { createAgent } from '../../src/accounts/agents.ts';
import { acceptPins } from '../../src/admin/upstreams.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { loadConfig } from '../../src/config.ts';
import { createPinAdmin } from '../../src/connectors/mcp/pin-accept.ts';
import { createUpstreamPins, type Listed } from '../../src/connectors/mcp/pins.ts';
import { isAppError } from '../../src/core/errors.ts';
import { createLogger } from '../../src/log.ts';
import { pino } from 'pino';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startRelabelingUpstream, type RelabelingUpstream } from '../helpers/relabeling-upstream.ts';
import {
  call,
  connectHttp,
  type SqlServer,
  startSqlServer,
  startTestServer,
  type TestServer,
  waitFor,
} from '../helpers/server.ts';

interface Row {
  seq: number;
  kind: string;
  tool: string;
  actor: string | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- tests read arbitrary detail fields
  details: Record<string, any>;
}

const rowsOf = async (knex: Knex, kind: string, tool?: string) =>
  (await knex('audit_events')
    .where({ kind })
    .modify((q) => (tool ? q.where({ tool }) : q))
    .orderBy('seq')
    .select('seq', 'kind', 'tool', 'actor', 'details')) as Row[];

const pinOf = async (knex: Knex, upstream: string, tool: string) =>
  (await knex('upstream_tool_pins').where({ upstream, tool }).first()) as
    | { class: string; accepted_by: string | null; pending_class: string | null; input_schema_sha256: string }
    | undefined;

for (const kind of databaseKinds()) {
  describe(`pinned classes of upstream tools on ${kind}`, () => {
    let first: TestServer;
    /** The server now running on the suite's database (a second start replaces the first). */
    let server: SqlServer;
    let agent: Client;
    let upstream: RelabelingUpstream;
    let configFile: string;

    const knex = () => server.sql;
    const crm = () => server.services.upstreams.find((u) => u.name === 'crm')!;
    const listed = async (name: string) => (await agent.listTools()).tools.find((t) => t.name === name);
    const cli = (...args: string[]) => runCli(['upstream', ...args], first.env);

    before(async () => {
      upstream = await startRelabelingUpstream();
      configFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-pins-')), 'config.json');
      fs.writeFileSync(
        configFile,
        JSON.stringify({
          upstreams: [
            { name: 'crm', url: upstream.url },
            // The same upstream, its annotations not trusted: every tool gated.
            { name: 'locked', url: upstream.url, trust_annotations: false },
          ],
        }),
      );
      first = await startTestServer(kind, { COUNTERSIGN_CONFIG: configFile });
      server = first;
      agent = await connectHttp(server.url, first.demoToken);
    });

    after(async () => {
      await agent?.close();
      if (server !== first) {
        await server?.close();
        await first?.db.drop();
      } else {
        await first?.stop();
      }
      await upstream?.close();
      fs.rmSync(path.dirname(configFile), { recursive: true, force: true });
    });

    it("pins each tool when first seen: upstream.tool_classified with its annotations and input schema's hash", async () => {
      const rows = await rowsOf(knex(), 'upstream.tool_classified');
      const byTool = new Map(rows.map((r) => [r.tool, r]));
      assert.deepEqual([...byTool.keys()].sort(), [
        'crm__peek',
        'crm__purge',
        'locked__peek',
        'locked__purge',
      ]);
      assert.equal(rows.length, 4, 'one row per tool');
      const purge = byTool.get('crm__purge')!;
      assert.deepEqual(
        { class: purge.details.class, annotations: purge.details.annotations, actor: purge.actor },
        { class: 'write', annotations: {}, actor: 'upstream:crm' },
      );
      const peek = byTool.get('crm__peek')!;
      assert.deepEqual([peek.details.class, peek.details.annotations], ['read', { readOnlyHint: true }]);
      // The hash is the one the gate binds approvals to.
      const draft = await call(agent, 'crm__purge', {});
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      assert.equal(purge.details.input_schema_sha256, draft.call.input_schema_sha256);
      assert.equal((await pinOf(knex(), 'crm', 'purge'))?.class, 'write');
      assert.equal((await pinOf(knex(), 'crm', 'peek'))?.class, 'read');
    });

    it('trust_annotations: false gates every tool, whatever its annotations claim', async () => {
      assert.equal((await listed('crm__peek'))?.annotations?.readOnlyHint, true);
      const locked = await listed('locked__peek');
      assert.equal(locked?.annotations?.readOnlyHint, false);
      assert.ok(locked?.inputSchema.properties?.dry_run, 'a gated write takes dry_run');
      const callsBefore = upstream.calls.length;
      const draft = await call(agent, 'locked__peek', {});
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      assert.deepEqual([draft.send_status, draft.approval.status], ['planned', 'pending']);
      assert.equal(upstream.calls.length, callsBefore, 'nothing reached the upstream');
      const [row] = await rowsOf(knex(), 'upstream.tool_classified', 'locked__peek');
      assert.deepEqual([row?.details.class, row?.details.annotations], ['write', { readOnlyHint: true }]);
    });

    it('keeps a write re-listed as readOnlyHint: true gated until an operator accepts it, all audited', async () => {
      upstream.relabel('purge', { readOnlyHint: true });
      await waitFor('the relisted purge', async () =>
        crm().tools().get('purge')?.tool.annotations?.readOnlyHint === true ? true : undefined,
      );
      const tool = await listed('crm__purge');
      assert.equal(tool?.annotations?.readOnlyHint, false, 'still listed as a gated write');
      const callsBefore = upstream.calls.length;
      const draft = await call(agent, 'crm__purge', {});
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      assert.deepEqual([draft.send_status, draft.approval.status], ['planned', 'pending']);
      assert.equal(upstream.calls.length, callsBefore, 'purge did not run without an approval');

      // Listed again and again: the change is recorded once.
      await crm().refresh();
      await crm().refresh();
      const changed = await rowsOf(knex(), 'upstream.classification_changed', 'crm__purge');
      assert.equal(changed.length, 1);
      assert.deepEqual(
        {
          held: changed[0]!.details.held,
          from: changed[0]!.details.from.class,
          to: changed[0]!.details.to.class,
          annotations: changed[0]!.details.to.annotations,
          pinned: changed[0]!.details.pinned_class,
        },
        { held: true, from: 'write', to: 'read', annotations: { readOnlyHint: true }, pinned: 'write' },
      );
      assert.deepEqual(
        [(await pinOf(knex(), 'crm', 'purge'))?.class, (await pinOf(knex(), 'crm', 'purge'))?.pending_class],
        ['write', 'read'],
      );

      const health = (await (await fetch(new URL('/healthz', server.url))).json()) as {
        upstreams: { name: string; held: number }[];
      };
      assert.equal(health.upstreams.find((u) => u.name === 'crm')?.held, 1);

      const list = await cli('list', 'crm');
      assert.equal(list.code, 0, list.stderr);
      const lines = list.stdout.split('\n');
      const at = lines.findIndex((l) => l.startsWith('crm__purge\twrite'));
      assert.ok(at >= 0, list.stdout);
      assert.match(lines[at + 1] ?? '', /^ {2}held: listed as read/);

      const accepted = await cli('accept', 'crm', 'purge');
      assert.equal(accepted.code, 0, accepted.stderr);
      await waitFor('purge to be a read', async () =>
        (await listed('crm__purge'))?.annotations?.readOnlyHint === true ? true : undefined,
      );
      const done = await call(agent, 'crm__purge', {});
      assert.equal(done.ok, true, JSON.stringify(done.error));
      assert.equal(done.content[0].text, 'purge done');
      assert.equal(upstream.calls.at(-1), 'purge');

      const [row, ...more] = await rowsOf(knex(), 'upstream.classification_accepted', 'crm__purge');
      assert.equal(more.length, 0);
      assert.match(row?.actor ?? '', /^cli:/);
      assert.deepEqual([row?.details.from.class, row?.details.to.class], ['write', 'read']);
      const pin = await pinOf(knex(), 'crm', 'purge');
      assert.deepEqual([pin?.class, pin?.pending_class, pin?.accepted_by], ['read', null, row?.actor]);
      assert.equal(crm().status().held, 0);
    });

    it('applies a listing that makes a tool more gated at once, recorded and pinned anew', async () => {
      upstream.relabel('peek', {});
      await waitFor('peek to be gated', async () =>
        (await listed('crm__peek'))?.annotations?.readOnlyHint === false ? true : undefined,
      );
      const draft = await call(agent, 'crm__peek', {});
      assert.deepEqual([draft.ok, draft.send_status], [true, 'planned']);
      const changed = await rowsOf(knex(), 'upstream.classification_changed', 'crm__peek');
      assert.deepEqual(
        changed.map((r) => [r.details.held, r.details.from.class, r.details.to.class]),
        [[false, 'read', 'write']],
      );
      assert.deepEqual((await pinOf(knex(), 'crm', 'peek'))?.class, 'write');
    });

    it('records a new input schema of the same class and pins it without holding it', async () => {
      const before = await pinOf(knex(), 'crm', 'purge');
      upstream.widen('purge');
      const [row] = await waitFor('the schema change recorded', async () => {
        const rows = await rowsOf(knex(), 'upstream.classification_changed', 'crm__purge');
        return rows.length === 2 ? rows.slice(1) : undefined;
      });
      assert.deepEqual(
        [row!.details.held, row!.details.from.class, row!.details.to.class],
        [false, 'read', 'read'],
      );
      assert.equal(row!.details.from.input_schema_sha256, before?.input_schema_sha256);
      const after = await pinOf(knex(), 'crm', 'purge');
      assert.equal(after?.input_schema_sha256, row!.details.to.input_schema_sha256);
      assert.notEqual(after?.input_schema_sha256, before?.input_schema_sha256);
      assert.deepEqual([after?.class, after?.pending_class], ['read', null]);
    });

    it('accept refuses an upstream or tool never seen; with nothing held it changes nothing', async () => {
      const refused = await acceptPins(
        { pins: createPinAdmin(knex(), createAuditLog(knex())) },
        { upstream: 'nope', actor: 'test' },
      ).catch((e) => e);
      assert.ok(isAppError(refused, 'NOT_FOUND', 'unknown_upstream'), String(refused));
      const noTool = await acceptPins(
        { pins: createPinAdmin(knex(), createAuditLog(knex())) },
        { upstream: 'crm', tool: 'nope', actor: 't' },
      ).catch((e) => e);
      assert.ok(isAppError(noTool, 'NOT_FOUND', 'unknown_tool'), String(noTool));
      assert.equal((await cli('accept', 'nope')).code, 1);

      const rowsBefore = (await rowsOf(knex(), 'upstream.classification_accepted')).length;
      const nothing = await cli('accept', 'crm');
      assert.equal(nothing.code, 0, nothing.stderr);
      assert.equal((await rowsOf(knex(), 'upstream.classification_accepted')).length, rowsBefore);
    });

    it('replicas seeing a tool or a change at once make one pin and record it once', async () => {
      const logs = [1, 2, 3].map(() => [] as Record<string, unknown>[]);
      const replicas = logs.map((lines) =>
        createUpstreamPins({
          knex: knex(),
          audit: createAuditLog(knex()),
          log: pino({ level: 'warn' }, { write: (line: string) => void lines.push(JSON.parse(line)) }),
        }),
      );
      const listing = (cls: Listed['class']) =>
        new Map<string, Listed>([
          ['drop_all', { class: cls, annotations: {}, input_schema_sha256: 'a'.repeat(64) }],
          [
            'count',
            { class: 'read', annotations: { readOnlyHint: true }, input_schema_sha256: 'b'.repeat(64) },
          ],
        ]);
      const firstSeen = await Promise.all(replicas.map((r) => r.classify('twin', listing('write'))));
      for (const pins of firstSeen) assert.deepEqual(pins.get('drop_all'), { class: 'write', held: null });
      assert.equal((await rowsOf(knex(), 'upstream.tool_classified', 'twin__drop_all')).length, 1);
      assert.equal((await rowsOf(knex(), 'upstream.tool_classified', 'twin__count')).length, 1);

      const relisted = await Promise.all(replicas.map((r) => r.classify('twin', listing('read'))));
      for (const pins of relisted) assert.deepEqual(pins.get('drop_all'), { class: 'write', held: 'read' });
      assert.equal((await rowsOf(knex(), 'upstream.classification_changed', 'twin__drop_all')).length, 1);

      // Listed again: no new row, and each process warned of the held change once.
      await Promise.all(replicas.map((r) => r.classify('twin', listing('read'))));
      assert.equal((await rowsOf(knex(), 'upstream.classification_changed', 'twin__drop_all')).length, 1);
      for (const lines of logs) {
        assert.deepEqual(
          lines.map((l) => [l.level, l.upstream, l.tool, l.pinned, l.listed]),
          [[40, 'twin', 'drop_all', 'write', 'read']],
        );
      }
    });

    it('a second start on the same database pins nothing again and keeps what was accepted', async () => {
      const classified = (await rowsOf(knex(), 'upstream.tool_classified')).length;
      const changed = (await rowsOf(knex(), 'upstream.classification_changed')).length;
      await agent.close();
      const config = loadConfig(first.env, first.db.dataDir);
      // The embedded database has one process: the first server stops. PostgreSQL: a second replica.
      if (kind === 'pglite') await first.close();
      server = await startSqlServer(config, createLogger(config.log_level));
      if (kind === 'postgres') await first.close();
      // A first run whose banner was never shown makes new credentials at the next start: a new agent.
      agent = await connectHttp(server.url, (await createAgent(knex(), { name: 'after-restart' })).token);
      await waitFor('crm to be listed', async () => (crm().tools().size === 2 ? true : undefined));
      assert.equal((await rowsOf(knex(), 'upstream.tool_classified')).length, classified);
      for (const tool of ['crm__peek', 'crm__purge', 'locked__peek', 'locked__purge']) {
        assert.equal((await rowsOf(knex(), 'upstream.tool_classified', tool)).length, 1, tool);
      }
      assert.equal((await rowsOf(knex(), 'upstream.classification_changed')).length, changed);
      assert.equal((await listed('crm__purge'))?.annotations?.readOnlyHint, true, 'accepted: a read');
      assert.equal((await listed('crm__peek'))?.annotations?.readOnlyHint, false, 'pinned a write');
    });

    it('accept works with no server running; the next start applies it', async () => {
      upstream.relabel('peek', { readOnlyHint: true });
      await waitFor('the held change of peek', async () =>
        (await pinOf(knex(), 'crm', 'peek'))?.pending_class === 'read' ? true : undefined,
      );
      assert.equal((await listed('crm__peek'))?.annotations?.readOnlyHint, false, 'held: still a write');
      await agent.close();
      await server.close();
      const accepted = await cli('accept', 'crm');
      assert.equal(accepted.code, 0, accepted.stderr);
      const config = loadConfig(first.env, first.db.dataDir);
      server = await startSqlServer(config, createLogger(config.log_level));
      agent = await connectHttp(server.url, (await createAgent(knex(), { name: 'third-start' })).token);
      await waitFor('crm to be listed', async () => (crm().tools().size === 2 ? true : undefined));
      assert.equal((await listed('crm__peek'))?.annotations?.readOnlyHint, true, 'accepted: a read');
      const rows = await rowsOf(knex(), 'upstream.classification_accepted', 'crm__peek');
      assert.deepEqual(
        rows.map((r) => [r.details.from.class, r.details.to.class]),
        [['write', 'read']],
      );
    });

    it('keeps the audit chain whole', async () => {
      const report = await verifyDatabaseChain(knex());
      assert.equal(report.first_bad, undefined);
      assert.equal(report.valid, report.rows);
    });
  });
}
