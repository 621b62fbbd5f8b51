import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client, FetchLike } from '@modelcontextprotocol/client';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { checkStructured } from '../../src/connectors/mcp/upstream.ts';
import { fetchUnwarned } from '../../src/core/fetch.ts';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { approveAsChair, type Chair } from '../helpers/approvals.ts';
import { databaseKinds } from '../helpers/db.ts';
import { gc } from '../helpers/gc.ts';
import {
  call,
  connectHttp,
  ROOT,
  startTestServer,
  type Envelope,
  type TestServer,
  waitFor,
} from '../helpers/server.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { freePort, startUpstreamFixture, type UpstreamFixture } from '../helpers/upstream-fixture.ts';

const FS_SERVER = path.join(ROOT, 'node_modules/@modelcontextprotocol/server-filesystem/dist/index.js');

const writesOf = async (server: TestServer, approvalId: string) =>
  (
    (await server
      .sql('audit_events')
      .where({ approval_id: approvalId })
      .whereLike('kind', 'write.%')
      .orderBy('seq')
      .select('kind')) as { kind: string }[]
  ).map((r) => r.kind);

for (const kind of databaseKinds()) {
  describe(`upstream MCP servers on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: Chair;
    let workDir: string;
    let crm: UpstreamFixture;
    let crmLater: number;
    const changes: number[] = [];

    const toolNames = async (client = agent) => (await client.listTools()).tools.map((t) => t.name);
    const fsUpstream = () => server.services.upstreams.find((u) => u.name === 'fs')!;

    before(async () => {
      workDir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-fs-')));
      crm = await startUpstreamFixture();
      crmLater = await freePort();
      const configFile = path.join(workDir, '..', `countersign-upstreams-${path.basename(workDir)}.json`);
      fs.writeFileSync(
        configFile,
        JSON.stringify({
          upstreams: [
            {
              name: 'fs',
              command: process.execPath,
              args: [FS_SERVER, workDir],
              tools: { list_allowed_directories: 'hidden' },
            },
            { name: 'crm', url: crm.url, timeout_ms: 1500, tools: { wipe: 'write' } },
            // Nothing listens here until a test starts it: an upstream that is down at start-up.
            { name: 'late', url: `http://127.0.0.1:${crmLater}/mcp` },
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
      // On the 2026-07-28 revision: list changes reach a client on the stream it opens with listen.
      // (2025-era clients are served statelessly over HTTP, with no stream for server notifications.)
      agent = await connectHttp(server.url, server.demoToken, 'modern');
      agent.setNotificationHandler('notifications/tools/list_changed', async () => {
        changes.push(Date.now());
      });
      await agent.listen({ toolsListChanged: true });
    });

    after(async () => {
      await agent?.close();
      await server?.stop();
      await crm?.close();
      fs.rmSync(workDir, { recursive: true, force: true });
    });

    it('re-exposes upstream tools as <name>__<tool>, gated writes with the controls, hidden ones left out', async () => {
      const { tools } = await agent.listTools();
      const byName = new Map(tools.map((t) => [t.name, t]));
      const read = byName.get('fs__read_text_file');
      const write = byName.get('fs__write_file');
      assert.ok(read && write, 'filesystem tools listed');
      assert.equal(read.annotations?.readOnlyHint, true);
      assert.equal(read.inputSchema.properties?.dry_run, undefined);
      assert.equal(write.annotations?.readOnlyHint, false);
      assert.deepEqual(
        ['path', 'content', 'dry_run', 'approval_id', 'idempotency_key'].filter(
          (p) => !(p in (write.inputSchema.properties ?? {})),
        ),
        [],
      );
      assert.equal(byName.has('fs__list_allowed_directories'), false, 'hidden by config');
      // The annotation says read; the config says write: config wins.
      assert.equal(byName.get('crm__wipe')?.annotations?.readOnlyHint, false);
      assert.equal(byName.get('crm__get_note')?.annotations?.readOnlyHint, true);
      assert.ok(byName.has('isphere_send_message'), 'built-in tools stay');
    });

    it('passes reads through, audited with the upstream as source', async () => {
      fs.writeFileSync(path.join(workDir, 'hello.txt'), 'שלום from disk');
      const res = await call(agent, 'fs__read_text_file', { path: path.join(workDir, 'hello.txt') });
      assert.equal(res.ok, true, JSON.stringify(res.error));
      assert.equal(res.content[0].text, 'שלום from disk');
      assert.equal(res.audit.source, 'mcp:fs');
      const row = await server.sql('audit_events').where({ seq: res.audit.audit_seq }).first();
      assert.equal(row.source, 'mcp:fs');
      assert.equal(row.tool, 'fs__read_text_file');
    });

    it('refuses arguments that do not match the upstream schema before anything is drafted', async () => {
      const before = await server.sql('approval_requests').count({ n: '*' }).first();
      const res = await call(agent, 'fs__write_file', { path: path.join(workDir, 'x.txt') });
      assert.equal(res.error?.code, 'INVALID_ARGUMENT');
      assert.match(res.error.message, /content/);
      const after = await server.sql('approval_requests').count({ n: '*' }).first();
      assert.equal(Number(after?.n), Number(before?.n));
    });

    it('write_file: a dry run writes nothing; once approved it writes exactly once', async () => {
      const file = path.join(workDir, 'report.txt');
      const args = { path: file, content: 'Q3 numbers: 预算 OK\n' };
      const draft = await call(agent, 'fs__write_file', args);
      assert.equal(draft.dry_run, true);
      assert.equal(draft.send_status, 'planned');
      assert.deepEqual(draft.call.arguments, args);
      assert.equal(draft.call.tool, 'write_file');
      assert.equal(draft.target.target_type, 'mcp_tool');
      assert.equal(draft.approval.status, 'pending');
      assert.match(draft.content_sha256, /^[0-9a-f]{64}$/);
      assert.equal(fs.existsSync(file), false, 'a dry run writes nothing');

      const approvalId = await approveAsChair(chair, draft);
      const done = await call(agent, 'fs__write_file', { ...args, dry_run: false, approval_id: approvalId });
      assert.equal(done.ok, true, JSON.stringify(done.error));
      assert.equal(done.send_status, 'sent');
      assert.equal(done.content_sha256, draft.content_sha256);
      assert.match(done.result.content[0].text, /Successfully wrote/);
      assert.equal(fs.readFileSync(file, 'utf8'), args.content);

      // Someone edits the file; replaying the approval must not write it again.
      fs.writeFileSync(file, 'edited by a person');
      const again = await call(agent, 'fs__write_file', { ...args, dry_run: false, approval_id: approvalId });
      assert.deepEqual([again.error?.code, again.error?.reason], ['APPROVAL_REQUIRED', 'consumed']);
      assert.equal(fs.readFileSync(file, 'utf8'), 'edited by a person');
      assert.deepEqual(await writesOf(server, approvalId), ['write.started', 'write.succeeded']);
    });

    it('shows the chair the exact upstream call on the review page, escaped', async () => {
      const content = '<script>alert(1)</script> & "quotes"';
      const draft = await call(agent, 'fs__write_file', {
        path: path.join(workDir, 'x-review.txt'),
        content,
      });
      const web = new WebClient(server.url);
      await web.login('chair-ada', 'correct horse 1');
      const page = await web.get(`/approvals/${draft.approval.approval_request_id}`);
      assert.equal(page.res.status, 200);
      assert.match(page.html, /<code>write_file<\/code> on upstream <code>fs<\/code>/);
      assert.ok(page.html.includes(draft.call.input_schema_sha256));
      assert.ok(page.html.includes('&lt;script&gt;alert(1)&lt;/script&gt;'), 'arguments are shown, escaped');
      assert.equal(page.html.includes('<script>alert(1)'), false);
    });

    it('refuses content changed after approval as a mismatch, and writes nothing', async () => {
      const file = path.join(workDir, 'memo.txt');
      const approvalId = await approveAsChair(
        chair,
        await call(agent, 'fs__write_file', { path: file, content: 'approved text' }),
      );
      const res = await call(agent, 'fs__write_file', {
        path: file,
        content: 'something else',
        dry_run: false,
        approval_id: approvalId,
      });
      assert.deepEqual([res.error?.code, res.error?.reason], ['APPROVAL_REQUIRED', 'mismatch']);
      assert.equal(fs.existsSync(file), false);
      const other = await call(agent, 'fs__write_file', {
        path: path.join(workDir, 'elsewhere.txt'),
        content: 'approved text',
        dry_run: false,
        approval_id: approvalId,
      });
      assert.equal(other.error?.reason, 'mismatch', 'the path is part of the approved call');
    });

    it('maps an upstream isError to CONNECTOR_FAILED with its text', async () => {
      const res = await call(agent, 'fs__read_text_file', { path: '/etc/hostname' });
      assert.equal(res.error?.code, 'CONNECTOR_FAILED');
      assert.match(res.error.message, /denied|outside/i);
      const broken = await call(agent, 'crm__broken');
      assert.equal(broken.error?.code, 'CONNECTOR_FAILED');
      assert.match(broken.error.message, /disk on fire/);
      assert.equal(broken.error.details.upstream_text, 'disk on fire');
    });

    it("holds structured content to the upstream's own output schema", async () => {
      const valid = await call(agent, 'crm__count_notes', { shape: 'valid' });
      assert.equal(valid.ok, true, JSON.stringify(valid.error));
      assert.equal(typeof (valid.structured_content as { count: unknown }).count, 'number');
      const invalid = await call(agent, 'crm__count_notes', { shape: 'invalid' });
      assert.equal(invalid.error?.code, 'CONNECTOR_FAILED');
      assert.match(invalid.error.message, /does not match the tool's output schema/);
      // An error result carries no structured content to check: its text is what the agent gets.
      const failed = await call(agent, 'crm__count_notes', { shape: 'error' });
      assert.equal(failed.error?.code, 'CONNECTOR_FAILED');
      assert.equal(failed.error.details.upstream_text, 'cannot count');
      const rows = await server
        .sql('audit_events')
        .whereIn(
          'seq',
          [valid, invalid, failed].map((r) => r.audit.audit_seq),
        )
        .orderBy('seq')
        .select('result', 'error_code');
      assert.deepEqual(
        rows.map((r: { result: string; error_code: string | null }) => [r.result, r.error_code]),
        [['ok', null], ...Array(2).fill(['error', 'CONNECTOR_FAILED'])],
      );
    });

    it('maps a slow upstream to TIMEOUT within the call deadline', async () => {
      const res = await call(agent, 'crm__slow', { ms: 5000 });
      assert.equal(res.error?.code, 'TIMEOUT');
      const fast = await call(agent, 'crm__get_note');
      assert.equal(fast.ok, true, 'the upstream stays usable after a timeout');
    });

    it('gates a tool whose annotation claims a read when config says write', async () => {
      const draft = await call(agent, 'crm__wipe');
      assert.equal(draft.send_status, 'planned');
      assert.equal(crm.notes.includes('(wiped)'), false);
      const res = await call(agent, 'crm__wipe', { dry_run: false });
      assert.deepEqual([res.error?.code, res.error?.reason], ['APPROVAL_REQUIRED', 'missing']);
    });

    it('an upstream killed mid-run answers SOURCE_UNAVAILABLE, keeps approvals unspent, then recovers', async () => {
      const file = path.join(workDir, 'after-restart.txt');
      const args = { path: file, content: 'written after recovery' };
      const approvalId = await approveAsChair(chair, await call(agent, 'fs__write_file', args));
      const firstPid = fsUpstream().pid();
      assert.ok(firstPid);
      process.kill(firstPid, 'SIGKILL');

      const down = await waitFor('the kill to be noticed', async () => {
        const res = await call(agent, 'fs__list_directory', { path: workDir });
        return res.ok ? undefined : res;
      });
      assert.equal(down.error.code, 'SOURCE_UNAVAILABLE');
      // Other upstreams are not blocked by one that is down.
      assert.equal((await call(agent, 'crm__get_note')).ok, true);
      if (fsUpstream().status().state !== 'up') {
        const refused = await call(agent, 'fs__write_file', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.equal(refused.error?.code, 'SOURCE_UNAVAILABLE');
        const row = await server.sql('approval_requests').where({ approval_id: approvalId }).first();
        assert.equal(row.status, 'approved', 'refused before the approval is consumed');
      }

      const listing = await waitFor('the upstream to come back', async () => {
        const res = await call(agent, 'fs__list_directory', { path: workDir });
        return res.ok ? res : undefined;
      });
      assert.match(listing.content[0].text, /report\.txt/);
      assert.notEqual(fsUpstream().pid(), firstPid, 'a new upstream process');
      const done = await call(agent, 'fs__write_file', { ...args, dry_run: false, approval_id: approvalId });
      assert.equal(done.ok, true, JSON.stringify(done.error));
      assert.equal(fs.readFileSync(file, 'utf8'), args.content);
    });

    it('an upstream down at start-up answers SOURCE_UNAVAILABLE, then its tools appear once it is up', async () => {
      assert.equal(
        (await toolNames()).some((n) => n.startsWith('late__')),
        false,
      );
      const res = await call(agent, 'late__get_note');
      assert.equal(res.error?.code, 'SOURCE_UNAVAILABLE');
      assert.equal(res.error.reason, 'upstream_down');
      const answer = await fetch(new URL('/healthz', server.url));
      // Degraded, not unavailable: a balancer's health check keeps this replica while an upstream is down.
      assert.equal(answer.status, 200);
      const health = (await answer.json()) as Envelope;
      assert.equal(health.status, 'degraded');
      assert.equal(health.upstreams.find((u: { name: string }) => u.name === 'late').state, 'down');

      const late = await startUpstreamFixture(crmLater);
      try {
        const seen = changes.length;
        await waitFor('late__ tools', async () =>
          (await toolNames()).includes('late__get_note') ? true : undefined,
        );
        assert.equal((await call(agent, 'late__get_note')).ok, true);
        await waitFor('a tools/list_changed notification', async () =>
          changes.length > seen ? true : undefined,
        );
      } finally {
        await late.close();
      }
    });

    it('picks up a changed tool list; an approval for a tool whose schema changed is refused', async () => {
      const args = { text: 'call Ada on Monday' };
      const draft = await call(agent, 'crm__set_note', args);
      const approvalId = await approveAsChair(chair, draft);
      const schemaBefore = draft.call.input_schema_sha256;

      crm.reshape();
      const tool = await waitFor('the new set_note schema', async () => {
        const t = (await agent.listTools()).tools.find((x) => x.name === 'crm__set_note');
        return t?.inputSchema.properties && 'priority' in t.inputSchema.properties ? t : undefined;
      });
      assert.deepEqual(tool.inputSchema.required?.includes('priority'), true);

      const res = await call(agent, 'crm__set_note', {
        ...args,
        priority: 1,
        dry_run: false,
        approval_id: approvalId,
      });
      assert.deepEqual([res.error?.code, res.error?.reason], ['APPROVAL_REQUIRED', 'mismatch']);
      const redraft = await call(agent, 'crm__set_note', { ...args, priority: 1 });
      assert.notEqual(redraft.call.input_schema_sha256, schemaBefore);
      assert.equal(crm.notes.includes(args.text), false, 'nothing was sent');
    });

    it('profiles apply: a readonly agent sees upstream reads only; a drafting agent cannot execute', async () => {
      const readonly = await createAgent(server.sql, { name: 'reader', profile: 'readonly' });
      const drafting = await createAgent(server.sql, { name: 'drafter', profile: 'drafting' });
      const r = await connectHttp(server.url, readonly.token);
      const d = await connectHttp(server.url, drafting.token);
      try {
        const names = await toolNames(r);
        assert.ok(names.includes('crm__get_note'));
        assert.equal(names.includes('crm__set_note'), false);
        const res = await call(d, 'crm__set_note', {
          text: 'x',
          priority: 2,
          dry_run: false,
          approval_id: 'nope',
        });
        assert.equal(res.error?.code, 'DRY_RUN_ONLY');
      } finally {
        await r.close();
        await d.close();
      }
    });

    it('keeps the audit chain whole', async () => {
      const report = await verifyDatabaseChain(server.sql);
      assert.equal(report.first_bad, undefined);
      assert.equal(report.valid, report.rows);
    });
  });
}

describe('the output check of an upstream tool', () => {
  const validate = (value: unknown) =>
    typeof (value as { count?: unknown }).count === 'number'
      ? { valid: true }
      : { valid: false, errorMessage: 'count must be a number' };
  const text = [{ type: 'text' as const, text: '1' }];

  it('passes matching structured content, and refuses content that is missing or does not match', () => {
    assert.doesNotThrow(() =>
      checkStructured('count', validate, { content: text, structuredContent: { count: 1 } }),
    );
    assert.throws(
      () => checkStructured('count', validate, { content: text }),
      /Tool count has an output schema but did not return structured content/,
    );
    assert.throws(
      () => checkStructured('count', validate, { content: text, structuredContent: { count: 'x' } }),
      /does not match the tool's output schema: count must be a number/,
    );
  });
});

describe('the fetch of an upstream over HTTP', () => {
  const abortListeners = (signal: AbortSignal) => getEventListeners(signal, 'abort').length;
  /** The leak warnings Node emits while `during` runs (and the ticks after it). */
  const leakWarnings = async (during: () => Promise<void>) => {
    const seen: string[] = [];
    const onWarning = (w: Error) => {
      if (w.name === 'MaxListenersExceededWarning') seen.push(w.message);
    };
    process.on('warning', onWarning);
    try {
      await during();
      await new Promise((r) => setImmediate(r));
    } finally {
      process.off('warning', onWarning);
    }
    return seen;
  };
  /** `count` requests started at once on one signal, as the SDK's transport starts them under load. */
  const burst = async (fetchFn: FetchLike, signal: AbortSignal, count: number) => {
    const requests = Array.from({ length: count }, () => fetchFn('data:,{}', { signal }));
    // Each started request hangs a listener on the signal until it is collected.
    assert.ok(abortListeners(signal) >= count, `${abortListeners(signal)} listeners`);
    await Promise.all(requests.map((r) => r.then((res) => res.text())));
  };

  it('raises no leak warning for the listeners fetch hangs on the one signal, and they go at collection', async () => {
    // Plain fetch warns once more than 1,500 requests are alive on one signal (one warning here).
    const plain = await leakWarnings(() => burst(fetch, new AbortController().signal, 1501));
    assert.equal(plain.length, 1, 'plain fetch warns: the burst below is big enough to tell');
    const signal = new AbortController().signal;
    assert.deepEqual(await leakWarnings(() => burst(fetchUnwarned, signal, 3000)), []);
    // Bounded by the collector, not kept: once the requests are collected their listeners are gone.
    await waitFor('the listeners of collected requests removed', async () => {
      gc();
      await new Promise((r) => setImmediate(r));
      return abortListeners(signal) < 10 ? true : undefined;
    });
  });
});
