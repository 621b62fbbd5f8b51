import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/server';
import { ANSWERS, answerOfError, outageAt, type NamedFailure, type Stage } from '../../src/core/answers.ts';
import { AppError, ErrorCode, HTTP_STATUS, OperatorCode } from '../../src/core/errors.ts';
import {
  createProgress,
  nothingDone,
  nothingDoneProblem,
  outageAnswer,
  problemOf,
  retryable,
  stageCode,
  stageOf,
  wireError,
} from '../../src/server/answer.ts';

// The one map from failure to answer, read without a server or a database.

const STAGES: Stage[] = ['not_started', 'started', 'finished'];

describe('the map from failure to answer', () => {
  it('answers every named failure on the wire, with its own data.code', () => {
    const codes = new Set<string>();
    for (const [failure, answer] of Object.entries(ANSWERS)) {
      assert.ok(answer.rpc, `${failure} has a JSON-RPC error`);
      codes.add(answer.rpc.data_code);
    }
    assert.equal(codes.size, Object.keys(ANSWERS).length);
  });

  it('says the JSON-RPC codes the README names', () => {
    assert.equal(ANSWERS.unknown_tool.rpc.code, -32602);
    assert.equal(ANSWERS.tool_denied.rpc.code, -32602);
    assert.equal(ANSWERS.call_timeout.rpc.code, -32001);
    assert.equal(ANSWERS.crash.rpc.code, -32603);
    assert.equal(ANSWERS.crash.rpc.data_code, 'INTERNAL');
    for (const stage of STAGES) assert.equal(ANSWERS[outageAt(stage)].rpc.code, -32003);
  });

  it('records every refusal in the call row and no outage (which cannot write one)', () => {
    const refusals: NamedFailure[] = ['unknown_tool', 'tool_denied', 'call_timeout', 'crash'];
    assert.deepEqual(
      refusals.map((f) => ANSWERS[f].audit),
      ['UNKNOWN_TOOL', 'TOOL_DENIED', 'CALL_TIMEOUT', 'INTERNAL_ERROR'],
    );
    for (const stage of STAGES) assert.equal(ANSWERS[outageAt(stage)].audit, null);
  });

  it('answers an outage by how far the write got, never from the failure', () => {
    assert.deepEqual(
      STAGES.map((s) => ANSWERS[outageAt(s)].rpc.data_code),
      ['SOURCE_UNAVAILABLE', 'OUTCOME_UNKNOWN', 'OUTCOME_RECORDED'],
    );
    assert.deepEqual(STAGES.map(stageCode), ['SOURCE_UNAVAILABLE', 'OUTCOME_UNKNOWN', 'OUTCOME_RECORDED']);
    // The envelope of a write whose row can still be written after its start: the same code as on the wire.
    assert.equal(ANSWERS['outage.started'].envelope.code, 'OUTCOME_UNKNOWN');
    assert.equal(ANSWERS['outage.finished'].envelope, null);
  });

  it('gives an HTTP problem only to what can fail before an MCP handler: a crash and an outage', () => {
    const withProblem = Object.entries(ANSWERS)
      .filter(([, a]) => a.http !== null)
      .map(([f]) => f);
    assert.deepEqual(withProblem.sort(), ['crash', 'outage.not_started']);
    assert.equal(ANSWERS.crash.http.status, 500);
    assert.equal(ANSWERS['outage.not_started'].http.status, 503);
  });

  it('answers a tool failure in the envelope, never on the wire, an operator code as INTERNAL_ERROR', () => {
    for (const code of ErrorCode.options) {
      const answer = answerOfError({ code, reason: 'r' });
      assert.deepEqual(answer.envelope, { code, reason: 'r' });
      assert.equal(answer.rpc, null);
      assert.deepEqual(answer.http, { status: HTTP_STATUS[code], code, reason: 'r' });
    }
    for (const code of OperatorCode.options) {
      const answer = answerOfError(new AppError(code, 'm'));
      assert.deepEqual(answer.envelope, { code: 'INTERNAL_ERROR', reason: null });
      assert.deepEqual(answer.http, { status: HTTP_STATUS[code], code, reason: code });
    }
  });
});

describe('the answers built from the map', () => {
  it('puts the row data.code and reason first in a protocol error', () => {
    const err = wireError('tool_denied', 'no', { reason: 'read only', trace_id: 't' });
    assert.ok(err instanceof ProtocolError);
    assert.equal(err.code, -32602);
    assert.deepEqual(Object.entries(err.data as object), [
      ['code', 'TOOL_DENIED'],
      ['reason', 'read only'],
      ['trace_id', 't'],
    ]);
  });

  it('refuses to build an answer a failure never has', () => {
    assert.throws(() => problemOf('tool_denied', 'x'), /not answered as an HTTP problem/);
  });

  it('tells a retry only when nothing started', () => {
    assert.deepEqual(Object.keys(nothingDone('t').data as object), [
      'code',
      'reason',
      'retry_after_s',
      'trace_id',
    ]);
    assert.equal(retryable(nothingDone('t')), true);
    const progress = createProgress();
    progress.start('ap', 'req');
    assert.equal(stageOf(progress), 'started');
    const started = outageAnswer(progress, 't', 'get_approval');
    assert.equal(retryable(started), false);
    assert.deepEqual(started.data, {
      code: 'OUTCOME_UNKNOWN',
      reason: 'database_unavailable',
      approval_id: 'ap',
      approval_request_id: 'req',
      next_step: { tool: 'get_approval', arguments: { approval_id: 'ap' } },
      trace_id: 't',
    });
    progress.finish('failed', 'CONNECTOR_FAILED');
    const finished = outageAnswer(
      progress,
      't',
      'get_approval',
      new AppError('SOURCE_UNAVAILABLE', 'm', 'x'),
    );
    assert.deepEqual(Object.keys(finished.data as object).slice(0, 4), [
      'code',
      'reason',
      'status',
      'error_code',
    ]);
    assert.equal((finished.data as { reason: string }).reason, 'call_unaudited');
  });

  it("keeps a started write's own failure reason in place of the row's", () => {
    const progress = createProgress();
    progress.start('ap', 'req');
    const err = outageAnswer(
      progress,
      't',
      'g',
      new AppError('SOURCE_UNAVAILABLE', 'm', 'audit_unavailable'),
    );
    assert.deepEqual(Object.entries(err.data as object).slice(0, 2), [
      ['code', 'OUTCOME_UNKNOWN'],
      ['reason', 'audit_unavailable'],
    ]);
  });

  it('says before any call began that nothing was done (HTTP 503 problem)', () => {
    assert.deepEqual(nothingDoneProblem, {
      code: 'SOURCE_UNAVAILABLE',
      reason: 'database_unavailable',
      title: 'Service unavailable',
      detail: 'the database is unavailable; nothing was done; retry shortly',
    });
  });
});
