import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describe, it } from 'node:test';
import type { SeamApprovals } from '../../../src/approval/index.ts';
import type { DraftWrite } from '../../../src/approval/request.ts';
import type { Agent } from '../../../src/core/identity.ts';
import type { AppError } from '../../../src/core/errors.ts';

/** What a contract case is given: the approvals, two agents, and a chair who approves. */
export interface ApprovalsUnderTest {
  approvals: SeamApprovals;
  agents: [Agent, Agent];
  /** A chair approves the request (one approval completes it); its approval_id. */
  approve(approval_request_id: string): Promise<string>;
}

const ADA = { target_type: 'contact', target_id: 'c_ada', display_name: 'Ada Lovelace' } as const;

/** A draft of a message to Ada; each call another content unless `text` is given. */
const draftOf = (agent: Agent, text = `hello ${randomUUID()}`): DraftWrite => ({
  agent,
  tool: 'send_message',
  source: 'local',
  target: ADA,
  content_sha256: Buffer.from(text).toString('hex').padEnd(64, '0').slice(0, 64),
  file_sha256: null,
  review: { content_text: text },
  request_id: randomUUID(),
  trace_id: randomUUID().replaceAll('-', ''),
  facts: { facet: 'send', target: ADA, text },
});

const executionOf = (draft: DraftWrite, approval_id: string, over: Partial<DraftWrite> = {}) => ({
  agent: over.agent ?? draft.agent,
  tool: draft.tool,
  approval_id,
  target: draft.target,
  content_sha256: over.content_sha256 ?? draft.content_sha256,
  file_sha256: null,
  request_id: randomUUID(),
  trace_id: randomUUID().replaceAll('-', ''),
  source: draft.source,
  facts: draft.facts,
});

const refusal = (err: unknown) => `${(err as AppError).code},${(err as AppError).reason}`;

/**
 * What the call seam asks of the approvals (SeamApprovals), held for the real ones on a database
 * (test/store/) and the twin (test/unit/), under the default policy (one approval from a chair).
 */
export function approvalsContract(name: string, open: () => Promise<ApprovalsUnderTest>) {
  describe(`the approvals contract: ${name}`, () => {
    it('drafts a pending request, and finds it again for the same content', async () => {
      const { approvals, agents } = await open();
      const draft = draftOf(agents[0]);
      const first = await approvals.request(draft);
      const again = await approvals.request({ ...draft, request_id: randomUUID() });
      assert.deepEqual([first.created, again.created], [true, false]);
      assert.equal(again.view.approval_request_id, first.view.approval_request_id);
      assert.equal(first.asks, 'one approval from a chair');
      const { approval_request_id: _id, created_at, expires_at, review_url: _url, ...view } = first.view;
      assert.ok(Date.parse(expires_at) > Date.parse(created_at));
      assert.deepEqual(view, {
        status: 'pending',
        approval_id: null,
        tool: 'send_message',
        source: 'local',
        target: ADA,
        content_sha256: draft.content_sha256,
        file_sha256: null,
        approvers: [],
        required_approvers: 1,
        note: null,
        execution: null,
      });
    });

    it("shows an agent its own requests, and never another agent's", async () => {
      const { approvals, agents } = await open();
      const { view } = await approvals.request(draftOf(agents[0]));
      const by = { approval_request_id: view.approval_request_id };
      assert.deepEqual(await approvals.getOwn(agents[0], by), view);
      assert.equal(await approvals.getOwn(agents[1], by), undefined);
      assert.equal(await approvals.getOwn(agents[0], { approval_request_id: 'not-a-uuid' }), undefined);
      const listed = await approvals.listOwn(agents[0], { limit: 100 });
      assert.ok(listed.items.some((v) => v.approval_request_id === view.approval_request_id));
      const theirs = await approvals.listOwn(agents[1], { limit: 100 });
      assert.ok(!theirs.items.some((v) => v.approval_request_id === view.approval_request_id));
    });

    it('refuses to execute what is not approved: an unknown approval, a pending request', async () => {
      const { approvals, agents } = await open();
      const draft = draftOf(agents[0]);
      const { view } = await approvals.request(draft);
      await assert.rejects(
        approvals.beginExecution(executionOf(draft, randomUUID())),
        (err) => refusal(err) === 'APPROVAL_REQUIRED,unknown',
      );
      // The request's own id, passed as an approval_id, says where the request stands.
      await assert.rejects(
        approvals.beginExecution(executionOf(draft, view.approval_request_id)),
        (err) => refusal(err) === 'APPROVAL_REQUIRED,pending',
      );
      const preflight = await approvals.preflight(executionOf(draft, view.approval_request_id));
      assert.deepEqual(
        [preflight.would_execute, preflight.code, preflight.reason],
        [false, 'APPROVAL_REQUIRED', 'pending'],
      );
    });

    it('executes an approved request once: its outcome is shown, and a second start is consumed', async () => {
      const { approvals, agents, approve } = await open();
      const draft = draftOf(agents[0]);
      const { view } = await approvals.request(draft);
      const approval_id = await approve(view.approval_request_id);
      const preflight = await approvals.preflight(executionOf(draft, approval_id));
      assert.deepEqual(preflight, { would_execute: true, code: null, reason: null, message: null });
      const early = approvals.readApproval(approval_id);
      assert.equal((await early)?.approval_id, approval_id);
      const { row, replay } = await approvals.beginExecution(executionOf(draft, approval_id), early);
      assert.deepEqual([row.status, row.approval_id, replay], ['executing', approval_id, false]);
      const finished = await approvals.finishExecution(
        row,
        { status: 'succeeded', result: { message_ref: 'm_1' } },
        { request_id: randomUUID(), trace_id: 't', source: 'local' },
      );
      assert.equal(finished, true);
      const shown = await approvals.getOwn(agents[0], { approval_id });
      assert.deepEqual(
        [shown?.status, shown?.execution?.status, shown?.execution?.result, shown?.approvers.length],
        ['succeeded', 'succeeded', { message_ref: 'm_1' }, 1],
      );
      await assert.rejects(
        approvals.beginExecution(executionOf(draft, approval_id)),
        (err) => refusal(err) === 'APPROVAL_REQUIRED,consumed',
      );
    });

    it("refuses another agent's approval, and an approval for other content", async () => {
      const { approvals, agents, approve } = await open();
      const draft = draftOf(agents[0]);
      const approval_id = await approve((await approvals.request(draft)).view.approval_request_id);
      await assert.rejects(
        approvals.beginExecution(executionOf(draft, approval_id, { agent: agents[1] })),
        (err) => refusal(err) === 'APPROVAL_REQUIRED,wrong_agent',
      );
      await assert.rejects(
        approvals.beginExecution(executionOf(draft, approval_id, { content_sha256: 'f'.repeat(64) })),
        (err) =>
          refusal(err) === 'APPROVAL_REQUIRED,mismatch' && (err as AppError).details?.differs === 'content',
      );
      // Neither refusal spent it.
      const { row } = await approvals.beginExecution(executionOf(draft, approval_id));
      assert.equal(row.status, 'executing');
    });

    it('makes one task per request, seen by its own agent only, and cancels it while it waits', async () => {
      const { approvals, agents } = await open();
      const { view } = await approvals.request(draftOf(agents[0]));
      const draft = {
        agent_id: agents[0].id,
        approval_request_id: view.approval_request_id,
        tool: 'isphere_send_message',
        arguments: { content_text: 'hi' },
      };
      const task = await approvals.tasks.create(draft);
      assert.equal((await approvals.tasks.create(draft)).taskId, task.taskId);
      assert.deepEqual([task.status, task.pollIntervalMs], ['working', 1000]);
      assert.match(task.statusMessage, /^Waiting for approval: /);
      assert.deepEqual(await approvals.tasks.get(agents[0], task.taskId), task);
      assert.equal(await approvals.tasks.get(agents[1], task.taskId), undefined);
      assert.deepEqual(await approvals.tasks.getMany(agents[1], [task.taskId]), []);
      assert.deepEqual(await approvals.tasks.cancel(agents[1], task.taskId), { kind: 'not_found' });
      const cancelled = await approvals.tasks.cancel(agents[0], task.taskId);
      assert.deepEqual(
        [cancelled.kind, cancelled.kind !== 'not_found' && cancelled.view.status],
        ['cancelled', 'cancelled'],
      );
      assert.equal(
        (await approvals.getOwn(agents[0], { approval_request_id: view.approval_request_id }))?.status,
        'expired',
      );
    });
  });
}
