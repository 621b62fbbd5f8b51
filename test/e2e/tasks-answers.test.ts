import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createTaskSessionFromClient, JsonRpcResponseError } from '@modelcontextprotocol/ext-tasks/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { databaseKinds } from '../helpers/db.ts';
import { connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';
import { taskSession } from '../helpers/tasks-client.ts';

const TOOL = 'isphere_send_message';
const message = (text: string, target_id = 'ct_david') => ({
  target_type: 'contact',
  target_id,
  content_text: text,
  dry_run: false,
});

type Revision = 'legacy' | 'modern';

/**
 * TOOL called as a task (the requester prefers one) by the official requester on `revision`: the
 * outcome it settles to, or the JSON-RPC error it was answered with. Anything else (a decode error)
 * is thrown: the requester could not read the answer.
 */
async function askWithRequester(
  server: TestServer,
  token: string,
  revision: Revision,
  args: typeof message extends (...a: never[]) => infer R ? R : never,
) {
  const client = await connectHttp(server.url, token, revision);
  const session =
    revision === 'modern'
      ? taskSession(client, server.url, token)
      : createTaskSessionFromClient(client, { endpointId: `countersign-answers-${token.slice(0, 12)}` });
  try {
    const execution = await session.callTool(TOOL, args, { task: { preference: 'prefer' } });
    const { outcome } = await execution.settle();
    return { kind: execution.kind, outcome } as const;
  } catch (err) {
    if (err instanceof JsonRpcResponseError) return { kind: 'error', err } as const;
    throw err;
  } finally {
    await session.close();
    await client.close();
  }
}

/** The error code the agent reads, from whichever answer the extension allows: a task, at once, or an error. */
function codeOf(answer: Awaited<ReturnType<typeof askWithRequester>>): string | undefined {
  if (answer.kind === 'error') {
    const data = answer.err.data as { code?: string; envelope?: Envelope };
    assert.equal(data.envelope?.error?.code, data.code, 'the envelope travels with the error');
    return data.code;
  }
  const outcome = answer.outcome as {
    status: string;
    result?: { isError?: boolean; structuredContent?: Envelope };
  };
  assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
  assert.equal(outcome.result?.isError, true);
  return outcome.result?.structuredContent?.error?.code;
}

for (const kind of databaseKinds()) {
  describe(`a task-augmented call answered as the Tasks extension requires, on ${kind}`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer(kind);
      await server.services.approvals.policy.set(
        {
          rules: [
            {
              name: 'No payroll',
              when: 'content.normalized.contains("payroll")',
              then: { deny: { reason: 'payroll goes by HR' } },
            },
          ],
        },
        'test-admin',
      );
    });
    after(async () => {
      await server?.stop();
    });

    for (const revision of ['legacy', 'modern'] as const) {
      const on = revision === 'legacy' ? '2025-11-25' : '2026-07-28';

      it(`answers a refused draft (TARGET_NOT_FOUND) readably on ${on}`, async () => {
        const answer = await askWithRequester(
          server,
          server.demoToken,
          revision,
          message('to nobody', 'ct_nobody'),
        );
        if (revision === 'legacy') assert.equal(answer.kind, 'error');
        assert.equal(codeOf(answer), 'TARGET_NOT_FOUND');
      });

      it(`answers a write a rule denies (PERMISSION_DENIED) readably on ${on}`, async () => {
        const answer = await askWithRequester(
          server,
          server.demoToken,
          revision,
          message('the payroll file'),
        );
        if (revision === 'legacy') assert.equal(answer.kind, 'error');
        assert.equal(codeOf(answer), 'PERMISSION_DENIED');
      });

      it(`answers a call past the rate limit (RATE_LIMITED) readably on ${on}`, async () => {
        const { token } = await createAgent(server.sql, {
          name: `limited-${revision}`,
          rate_limit_per_min: 1,
        });
        // The first call takes the minute's one; the second is refused.
        const first = await askWithRequester(
          server,
          token,
          revision,
          message('to nobody at all', 'ct_nobody'),
        );
        assert.equal(codeOf(first), 'TARGET_NOT_FOUND');
        const answer = await askWithRequester(server, token, revision, message('one call too many'));
        if (revision === 'legacy') assert.equal(answer.kind, 'error');
        assert.equal(codeOf(answer), 'RATE_LIMITED');
      });

      it(`still answers a drafted write as a task on ${on}`, async () => {
        const client = await connectHttp(server.url, server.demoToken, revision);
        const session =
          revision === 'modern'
            ? taskSession(client, server.url, server.demoToken)
            : createTaskSessionFromClient(client, { endpointId: `countersign-answers-draft-${revision}` });
        try {
          const execution = await session.callTool(TOOL, message(`drafted as a task on ${on}`), {
            task: { preference: 'prefer' },
          });
          assert.equal(execution.kind, 'task');
        } finally {
          await session.close();
          await client.close();
        }
      });
    }
  });
}
