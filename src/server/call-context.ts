import type { CallToolResult } from '@modelcontextprotocol/server';
import type { Agent } from '../core/identity.ts';

/**
 * What a transport hands the call seam with each request, typed: who is calling (authenticated by the
 * transport), and, where the transport can hold an answer back, the hold. The SDK's own per-request
 * context (McpRequestContext) carries the HTTP side; this carries ours, so nothing of a request travels
 * in an untyped bag.
 */
export interface RequestContext {
  agent: Agent;
  hold?: AnswerHold;
}

/**
 * A call's answer held back until the call's audit row has committed. A transport that can hold an
 * answer gives each call one; the call then returns its result as soon as the row's statement is on its
 * way — so that turning the result into the answer overlaps the database's work — and hands over the
 * commit with `until`. That promise resolves to undefined when the result stands, to the result to
 * send instead when the row was chained anew (its seq changed), and rejects with the protocol error to
 * answer when the row could not be committed. The transport sends nothing before it settles.
 */
export interface AnswerHold {
  until(committed: Promise<CallToolResult | undefined>): void;
}

/** The transport's side of a hold: `settled` waits for the commit a call handed over, if any. */
export function createAnswerHold(): AnswerHold & { settled(): Promise<CallToolResult | undefined> } {
  let held: Promise<CallToolResult | undefined> | undefined;
  return {
    until(committed) {
      held = committed;
      // Awaited by `settled`; until then a failed commit is not an unhandled rejection.
      committed.catch(() => {});
    },
    settled: () => held ?? Promise.resolve(undefined),
  };
}
