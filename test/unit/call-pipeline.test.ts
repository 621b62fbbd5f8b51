import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/server';
import { contentSha256 } from '../../src/approval/gate.ts';
import type { AuditRow } from '../../src/audit/chain.ts';
import { AppError } from '../../src/core/errors.ts';
import { createAnswerHold } from '../../src/server/call-context.ts';
import { MAX_ARGUMENT_DEPTH } from '../../src/server/call.ts';
import { agentOf, seamOnTwins } from '../twins/seam.ts';

/*
 * createCallPipeline (src/server/call.ts) driven step by step over the twins (test/twins/): no server,
 * no database. Envelopes are asserted whole, with the ids the call's own row carries; the clock twin
 * stands still, so started_at and finished_at are known.
 */

const T0 = '2026-12-07T12:00:00.000Z';
type Envelope = Record<string, unknown> & { audit: Record<string, unknown> };

const envelopeOf = (result: { structuredContent?: unknown }) => result.structuredContent as Envelope;

/** The protocol error a call was answered with: its JSON-RPC code and data. */
async function protocolError(
  call: Promise<unknown>,
): Promise<{ code: number; data: Record<string, unknown> }> {
  const err = await call.then(
    () => assert.fail('expected a protocol error'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ProtocolError, String(err));
  return { code: err.code, data: err.data as Record<string, unknown> };
}

/** The audit block every envelope of a call carries, for the call whose row is `row`. */
const auditBlock = (row: AuditRow, over: Record<string, unknown> = {}) => ({
  tool: row.tool,
  request_id: row.request_id,
  trace_id: row.trace_id,
  source: null,
  operator_id: 'agent-1',
  approval_id: null,
  dry_run: false,
  target_ref: null,
  content_sha256: null,
  file_sha256: null,
  started_at: T0,
  finished_at: T0,
  result: 'ok',
  audit_seq: row.seq,
  ...over,
});

const SEND = { target_type: 'contact', target_id: 'c_ada', content_text: 'hello' } as const;
const ADA = { target_type: 'contact', target_id: 'c_ada', display_name: 'Ada Lovelace' } as const;

describe('the call seam over twins: a read', () => {
  it('answers a read with its envelope, after its tool.call row', async () => {
    const seam = seamOnTwins();
    const result = await seam.call('isphere_search_contacts', { query: 'ada' });
    const [row] = seam.audit.rows;
    assert.ok(row);
    assert.deepEqual(
      {
        kind: row.kind,
        tool: row.tool,
        agent_id: row.agent_id,
        result: row.result,
        error_code: row.error_code,
      },
      {
        kind: 'tool.call',
        tool: 'isphere_search_contacts',
        agent_id: 'agent-1',
        result: 'ok',
        error_code: null,
      },
    );
    assert.deepEqual(Object.keys(row.details), ['args_sha256', 'duration_ms', 'count', 'agent_name']);
    assert.deepEqual([row.details.duration_ms, row.details.agent_name], [0, 'unit-agent']);
    assert.equal(result.isError, undefined);
    assert.deepEqual(envelopeOf(result), {
      ok: true,
      status: 'ok',
      contacts: [
        {
          contact_id: 'c_ada',
          display_name: 'Ada Lovelace',
          account: 'ada',
          department: null,
          title: null,
          active: true,
          confidence: 1,
          raw_ref: 'c_ada',
          source: 'local',
        },
      ],
      next_cursor: null,
      audit: auditBlock(row, { source: 'local' }),
    });
    // The text content is the same JSON.
    assert.deepEqual(result.content, [{ type: 'text', text: JSON.stringify(envelopeOf(result)) }]);
  });

  it('times the call on the seam clock: started_at, finished_at and duration_ms', async () => {
    const seam = seamOnTwins({}, { faults: { at: (point) => void (point === 'before_handler' && tick()) } });
    const tick = () => seam.clock.advance(1500);
    const envelope = envelopeOf(await seam.call('isphere_search_contacts', { query: 'ada' }));
    assert.deepEqual(
      [envelope.audit.started_at, envelope.audit.finished_at, seam.audit.rows[0]!.details.duration_ms],
      [T0, '2026-12-07T12:00:01.500Z', 1500],
    );
  });

  it('lists only the tools the profile allows, in catalogue order', () => {
    const seam = seamOnTwins();
    const all = seam.pipeline.listTools(agentOf()).map((t) => t.name);
    const readonly = seam.pipeline.listTools(agentOf({ profile: 'readonly' })).map((t) => t.name);
    assert.ok(all.includes('isphere_send_message'));
    assert.ok(!readonly.includes('isphere_send_message'));
    assert.deepEqual(
      readonly,
      all.filter((n) => readonly.includes(n)),
    );
  });
});

describe('the call seam over twins: a write', () => {
  it('drafts a dry run: the approval request, then the call row, and the envelope that says what to do next', async () => {
    const seam = seamOnTwins();
    const result = await seam.call('isphere_send_message', SEND);
    const [requested, row] = seam.audit.rows;
    assert.ok(requested && row);
    assert.equal(requested.kind, 'approval.requested');
    const request = [...seam.approvals.requests.values()][0]!;
    const sha = contentSha256('send_message', 'local', ADA, { content_text: 'hello' });
    const review_url = `https://countersign.test/approvals/${request.id}`;
    assert.deepEqual(envelopeOf(result), {
      ok: true,
      status: 'ok',
      dry_run: true,
      send_status: 'planned',
      target: ADA,
      content_sha256: sha,
      approval: {
        approval_request_id: request.id,
        status: 'pending',
        review_url,
        next_step:
          `This request needs one approval from a chair, given in the web form at ${review_url}; then ` +
          'isphere_get_approval gives its approval_id; repeat this call with dry_run: false and that approval_id.',
        expires_at: '2026-12-10T12:00:00.000Z',
      },
      preflight: null,
      message_ref: null,
      next_cursor: null,
      audit: auditBlock(row, { source: 'local', dry_run: true, target_ref: 'c_ada', content_sha256: sha }),
    });
    assert.deepEqual(
      { approval_request_id: row.details.approval_request_id, created: row.details.created },
      { approval_request_id: request.id, created: true },
    );
    // The same dry run again finds the same request.
    const again = envelopeOf(await seam.call('isphere_send_message', SEND));
    assert.equal((again.approval as { approval_request_id: string }).approval_request_id, request.id);
    assert.equal(seam.audit.rows.at(-1)!.details.created, false);
    assert.equal(seam.connector.sent.length, 0);
  });

  it('refuses a real write without an approval, and one whose request is still pending', async () => {
    const seam = seamOnTwins();
    const missing = envelopeOf(await seam.call('isphere_send_message', { ...SEND, dry_run: false }));
    assert.deepEqual([missing.ok, missing.status], [false, 'error']);
    const error = missing.error as { code: string; reason: string };
    assert.deepEqual([error.code, error.reason], ['APPROVAL_REQUIRED', 'missing']);
    const dry = envelopeOf(await seam.call('isphere_send_message', SEND));
    const id = (dry.approval as { approval_request_id: string }).approval_request_id;
    const pending = envelopeOf(
      await seam.call('isphere_send_message', { ...SEND, dry_run: false, approval_id: id }),
    );
    const refusal = pending.error as { code: string; reason: string };
    assert.deepEqual([refusal.code, refusal.reason], ['APPROVAL_REQUIRED', 'pending']);
    const row = seam.audit.rows.at(-1)!;
    assert.deepEqual([row.kind, row.result, row.error_code], ['tool.call', 'error', 'APPROVAL_REQUIRED']);
    assert.equal(seam.connector.sent.length, 0);
  });

  it('executes an approved write once: write.started, write.succeeded, the call row; a second run is refused', async () => {
    const seam = seamOnTwins();
    const dry = envelopeOf(await seam.call('isphere_send_message', SEND));
    const approval_id = seam.approvals.approve(
      (dry.approval as { approval_request_id: string }).approval_request_id,
    );
    const before = seam.audit.rows.length;
    const sent = envelopeOf(
      await seam.call('isphere_send_message', { ...SEND, dry_run: false, approval_id }),
    );
    assert.deepEqual(
      [sent.ok, sent.send_status, sent.message_ref],
      [true, 'sent', seam.connector.sent[0]!.ref],
    );
    assert.equal(sent.audit.approval_id, approval_id);
    assert.deepEqual(
      seam.audit.rows.slice(before).map((r) => [r.kind, r.approval_id, r.result]),
      [
        ['write.started', approval_id, null],
        ['write.succeeded', approval_id, 'ok'],
        ['tool.call', approval_id, 'ok'],
      ],
    );
    assert.deepEqual(
      seam.connector.sent.map((m) => [m.key, m.text]),
      [[approval_id, 'hello']],
    );
    const twice = envelopeOf(
      await seam.call('isphere_send_message', { ...SEND, dry_run: false, approval_id }),
    );
    assert.deepEqual(
      [(twice.error as { code: string }).code, (twice.error as { reason: string }).reason],
      ['APPROVAL_REQUIRED', 'consumed'],
    );
    assert.equal(seam.connector.sent.length, 1);
  });

  it('refuses an approval for other content, naming what differs', async () => {
    const seam = seamOnTwins();
    const dry = envelopeOf(await seam.call('isphere_send_message', SEND));
    const approval_id = seam.approvals.approve(
      (dry.approval as { approval_request_id: string }).approval_request_id,
    );
    const other = envelopeOf(
      await seam.call('isphere_send_message', {
        ...SEND,
        content_text: 'goodbye',
        dry_run: false,
        approval_id,
      }),
    );
    const error = other.error as { code: string; reason: string; details: unknown };
    assert.deepEqual([error.code, error.reason], ['APPROVAL_REQUIRED', 'mismatch']);
    assert.equal(seam.connector.sent.length, 0);
  });

  it('drafts a write asked for as a task and answers with the task, which the agent can read back', async () => {
    const seam = seamOnTwins();
    const agent = agentOf();
    const result = await seam.pipeline.call(
      agent,
      'isphere_send_message',
      { ...SEND, dry_run: false },
      new AbortController().signal,
      undefined,
      { asTask: true },
    );
    const task = result as unknown as Record<string, unknown>;
    const request = [...seam.approvals.requests.values()][0]!;
    assert.deepEqual(task, {
      resultType: 'task',
      taskId: task.taskId,
      status: 'working',
      statusMessage: `Waiting for approval: a chair reviews it at https://countersign.test/approvals/${request.id}`,
      createdAt: T0,
      lastUpdatedAt: T0,
      ttlMs: 259_200_000,
      pollIntervalMs: 1000,
      content: [],
    });
    assert.deepEqual(
      seam.audit.rows.map((r) => r.kind),
      ['approval.requested', 'tool.call'],
    );
    const read = await seam.pipeline.tasks.get(agent, task.taskId as string);
    assert.equal(read?.status, 'working');
    assert.equal(await seam.pipeline.tasks.get(agentOf({ id: 'agent-2' }), task.taskId as string), undefined);
    const listed = await seam.pipeline.tasks.list(agent);
    assert.deepEqual(
      listed.items.map((t) => t.taskId),
      [task.taskId],
    );
  });
});

describe('the call seam over twins: refusals', () => {
  it('rate-limits before anything else: past the limit, even an unknown tool is answered RATE_LIMITED', async () => {
    // At the start of a minute, two calls at a limit of two: the next fits once the window has slid past
    // this minute's end (60 s) and half of the next (30 s), when the two weigh one.
    const seam = seamOnTwins();
    const agent = agentOf({ rate_limit_per_min: 2 });
    for (let i = 0; i < 2; i++)
      assert.equal(envelopeOf(await seam.call('isphere_search_contacts', { query: 'a' }, agent)).ok, true);
    for (const name of ['isphere_search_contacts', 'no_such_tool']) {
      const limited = await seam.call(name, { query: 'a' }, agent);
      const envelope = envelopeOf(limited);
      assert.equal(limited.isError, true);
      const row = seam.audit.rows.at(-1)!;
      assert.deepEqual(envelope, {
        ok: false,
        status: 'error',
        next_cursor: null,
        error: {
          code: 'RATE_LIMITED',
          message: envelope.error && (envelope.error as { message: string }).message,
          reason: 'rate_limited',
          trace_id: row.trace_id,
          details: { retry_after_s: 90 },
          retry_after_s: 90,
        },
        audit: auditBlock(row, { result: 'error', tool: row.tool }),
      });
      assert.match((envelope.error as { message: string }).message, /^too many calls: retry in 90 s$/);
      assert.deepEqual([row.error_code, row.details.reason], ['RATE_LIMITED', 'rate_limited']);
    }
    // Counted once the answer is on its way (record, in call.ts).
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(seam.metrics.counters.rate_limited_calls, 2);
    // A minute and a half on, the previous minute weighs half: one call fits again.
    seam.clock.advance(90_000);
    assert.equal(envelopeOf(await seam.call('isphere_search_contacts', { query: 'a' }, agent)).ok, true);
  });

  it('refuses an unknown tool with -32602, naming the closest one, after its row', async () => {
    const seam = seamOnTwins();
    const { code, data } = await protocolError(seam.call('isphere_search_contact', { query: 'a' }));
    const row = seam.audit.rows.at(-1)!;
    assert.equal(code, -32602);
    assert.deepEqual(data, {
      code: 'UNKNOWN_TOOL',
      did_you_mean: 'isphere_search_contacts',
      trace_id: row.trace_id,
    });
    assert.deepEqual(
      [row.kind, row.tool, row.result, row.error_code],
      ['tool.call', 'isphere_search_contact', 'error', 'UNKNOWN_TOOL'],
    );
    assert.equal(typeof row.details.tool_sha256, 'string');
  });

  it('refuses a tool the profile denies with -32602 TOOL_DENIED and an auth.denied row', async () => {
    const seam = seamOnTwins();
    const agent = agentOf({ profile: 'readonly' });
    const { code, data } = await protocolError(seam.call('isphere_send_message', SEND, agent));
    const row = seam.audit.rows.at(-1)!;
    assert.equal(code, -32602);
    assert.equal(data.code, 'TOOL_DENIED');
    assert.equal(data.trace_id, row.trace_id);
    assert.deepEqual(
      [row.kind, row.error_code, row.details.facet, row.details.profile],
      ['auth.denied', 'TOOL_DENIED', 'send', 'readonly'],
    );
    assert.equal(seam.metrics.counters.denied_calls, 1);
    assert.equal(seam.approvals.requests.size, 0);
  });

  it('answers an upstream that is down SOURCE_UNAVAILABLE in the envelope', async () => {
    const seam = seamOnTwins();
    seam.catalogue.down(
      'github',
      () => new AppError('SOURCE_UNAVAILABLE', 'upstream github is down', 'upstream_down'),
    );
    const envelope = envelopeOf(await seam.call('github__create_issue', {}));
    assert.deepEqual([envelope.ok, (envelope.error as { code: string }).code], [false, 'SOURCE_UNAVAILABLE']);
    assert.equal(seam.audit.rows.at(-1)!.error_code, 'SOURCE_UNAVAILABLE');
  });

  it('refuses arguments that break the schema, or hold a NUL, with INVALID_ARGUMENT in the envelope', async () => {
    const seam = seamOnTwins();
    const bad = envelopeOf(await seam.call('isphere_search_contacts', { query: 'a', extra: 1 }));
    assert.deepEqual(
      [(bad.error as { code: string }).code, (bad.error as { reason: string }).reason],
      ['INVALID_ARGUMENT', 'invalid_argument'],
    );
    const nul = envelopeOf(await seam.call('isphere_search_contacts', { query: 'a\u0000b' }));
    assert.deepEqual(
      [(nul.error as { code: string }).code, (nul.error as { reason: string }).reason],
      ['INVALID_ARGUMENT', 'nul_byte'],
    );
    const row = seam.audit.rows.at(-1)!;
    assert.deepEqual((row.details.invalid_argument as { field: string }).field, 'query');
  });

  it('answers a handler past the deadline -32001 CALL_TIMEOUT, after its row', async () => {
    const seam = seamOnTwins(
      { COUNTERSIGN_CALL_TIMEOUT_MS: '50' },
      {
        faults: {
          at: (point) => (point === 'before_handler' ? new Promise((r) => setTimeout(r, 200)) : undefined),
        },
      },
    );
    const { code, data } = await protocolError(seam.call('isphere_search_contacts', { query: 'a' }));
    assert.deepEqual([code, data.code], [-32001, 'CALL_TIMEOUT']);
    assert.equal(seam.audit.rows.at(-1)!.error_code, 'CALL_TIMEOUT');
    assert.equal(seam.metrics.counters.overrun_calls, 1);
  });
});

describe('the call seam over twins: begin and handle', () => {
  it('refuses arguments nested past the limit before any step walks them, with no digest in the row', async () => {
    const seam = seamOnTwins();
    let deep: Record<string, unknown> = {};
    for (let i = 0; i < MAX_ARGUMENT_DEPTH; i++) deep = { a: deep };
    const envelope = envelopeOf(await seam.call('isphere_search_contacts', { query: 'a', extra: deep }));
    const error = envelope.error as { code: string; reason: string };
    assert.deepEqual([error.code, error.reason], ['INVALID_ARGUMENT', 'too_deep']);
    assert.equal(seam.audit.rows.at(-1)!.details.args_sha256, null);
  });

  it('answers a handler that crashes -32603 INTERNAL with the trace id and no text of its own, after its row', async () => {
    const seam = seamOnTwins();
    seam.connector.searchContacts = async () => {
      throw new Error('secret detail of a bug');
    };
    const { code, data } = await protocolError(seam.call('isphere_search_contacts', { query: 'a' }));
    const row = seam.audit.rows.at(-1)!;
    assert.equal(code, -32603);
    assert.deepEqual(data, { code: 'INTERNAL', trace_id: row.trace_id });
    assert.deepEqual([row.result, row.error_code], ['error', 'INTERNAL_ERROR']);
    assert.ok(!JSON.stringify(row).includes('secret detail'));
  });

  it("marks the rows of a task's execution as the task's", async () => {
    const seam = seamOnTwins();
    const dry = envelopeOf(await seam.call('isphere_send_message', SEND));
    const approval_id = seam.approvals.approve(
      (dry.approval as { approval_request_id: string }).approval_request_id,
    );
    const before = seam.audit.rows.length;
    const result = await seam.pipeline.call(
      agentOf(),
      'isphere_send_message',
      { ...SEND, dry_run: false, approval_id },
      new AbortController().signal,
      undefined,
      { task_id: 'task-1' },
    );
    assert.equal(envelopeOf(result).send_status, 'sent');
    assert.deepEqual(
      seam.audit.rows.slice(before).map((r) => [r.kind, r.details.origin, r.details.task_id]),
      [
        ['write.started', 'task', 'task-1'],
        ['write.succeeded', 'task', 'task-1'],
        ['tool.call', 'task', 'task-1'],
      ],
    );
  });

  it('leaves a write the connector may have made executing, for reconciliation: no outcome row', async () => {
    const seam = seamOnTwins();
    const dry = envelopeOf(await seam.call('isphere_send_message', SEND));
    const id = (dry.approval as { approval_request_id: string }).approval_request_id;
    const approval_id = seam.approvals.approve(id);
    seam.connector.failSends(new AppError('TIMEOUT', 'the bridge did not answer', 'bridge_timeout'));
    const envelope = envelopeOf(
      await seam.call('isphere_send_message', { ...SEND, dry_run: false, approval_id }),
    );
    assert.deepEqual([envelope.ok, (envelope.error as { code: string }).code], [false, 'TIMEOUT']);
    assert.deepEqual(
      seam.audit.rows.slice(-2).map((r) => [r.kind, r.error_code]),
      [
        ['write.started', null],
        ['tool.call', 'TIMEOUT'],
      ],
    );
    assert.equal(seam.approvals.requests.get(id)!.status, 'executing');
  });
});

describe('the call seam over twins: the audit log', () => {
  it('gives no answer without its row: with the log down, a read is answered -32003 and nothing is recorded', async () => {
    const seam = seamOnTwins();
    seam.audit.outage();
    const { code, data } = await protocolError(seam.call('isphere_search_contacts', { query: 'a' }));
    assert.equal(code, -32003);
    assert.deepEqual([data.code, data.reason], ['SOURCE_UNAVAILABLE', 'database_unavailable']);
    assert.equal(seam.audit.rows.length, 0);
    seam.audit.outage(false);
    assert.equal(envelopeOf(await seam.call('isphere_search_contacts', { query: 'a' })).audit.audit_seq, 1);
  });

  it('answers an execution whose start lost its connection as a write that may have started, never as nothing done', async () => {
    for (const [lost, answer] of [
      [new Error('Connection terminated unexpectedly'), 'OUTCOME_UNKNOWN'],
      [
        Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' }),
        'SOURCE_UNAVAILABLE',
      ],
    ] as const) {
      const seam = seamOnTwins();
      const dry = envelopeOf(await seam.call('isphere_send_message', SEND));
      const approval_id = seam.approvals.approve(
        (dry.approval as { approval_request_id: string }).approval_request_id,
      );
      // The database goes away while the statement that spends the approval is out (or before it could
      // be sent): the call's own row cannot be written either.
      seam.approvals.beginExecution = () => {
        seam.audit.outage();
        return Promise.reject(lost);
      };
      const { code, data } = await protocolError(
        seam.call('isphere_send_message', { ...SEND, dry_run: false, approval_id }),
      );
      assert.equal(code, -32003);
      assert.equal(data.code, answer);
      if (answer === 'OUTCOME_UNKNOWN')
        assert.deepEqual([data.in_doubt, data.approval_id], [true, approval_id]);
      assert.equal(seam.connector.sent.length, 0);
    }
  });

  it('answers a write whose outcome committed but whose call row did not by that outcome', async () => {
    // The log goes down between the write's outcome and the call's own row.
    let cut = false;
    const seam = seamOnTwins(
      {},
      {
        faults: { at: (point) => void (point === 'before_call_row' && cut && seam.audit.outage()) },
      },
    );
    const dry = envelopeOf(await seam.call('isphere_send_message', SEND));
    const approval_id = seam.approvals.approve(
      (dry.approval as { approval_request_id: string }).approval_request_id,
    );
    cut = true;
    const { code, data } = await protocolError(
      seam.call('isphere_send_message', { ...SEND, dry_run: false, approval_id }),
    );
    assert.equal(code, -32003);
    assert.deepEqual([data.code, data.status], ['OUTCOME_RECORDED', 'succeeded']);
    assert.deepEqual(
      seam.audit.rows.slice(-2).map((r) => r.kind),
      ['write.started', 'write.succeeded'],
    );
    assert.equal(seam.connector.sent.length, 1);
  });

  it('holds the answer: the result comes back before its row commits, and the hold settles with the commit', async () => {
    const seam = seamOnTwins();
    const hold = createAnswerHold();
    const release = seam.audit.holdCommits();
    const result = await seam.pipeline.call(
      agentOf(),
      'isphere_search_contacts',
      { query: 'a' },
      new AbortController().signal,
      hold,
    );
    assert.equal(envelopeOf(result).audit.audit_seq, 1);
    assert.equal(seam.audit.rows.length, 0, 'answered before the commit');
    release();
    assert.equal(await hold.settled(), undefined);
    assert.equal(seam.audit.rows.length, 1);
  });

  it('holds the answer, and a commit that fails turns it into -32003', async () => {
    const seam = seamOnTwins();
    const hold = createAnswerHold();
    const release = seam.audit.holdCommits();
    await seam.pipeline.call(
      agentOf(),
      'isphere_search_contacts',
      { query: 'a' },
      new AbortController().signal,
      hold,
    );
    seam.audit.outage();
    release();
    const { code, data } = await protocolError(hold.settled());
    assert.deepEqual([code, data.code], [-32003, 'SOURCE_UNAVAILABLE']);
    assert.equal(seam.audit.rows.length, 0);
  });
});
