import type { Knex } from 'knex';
import { verifyDatabase } from '../../src/audit/context.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { sleep } from '../lib/stats.ts';
import type { Outcome, Tally } from './outcome.ts';
import type { TaskCallRecord, WriteRecord } from './workload.ts';

export interface InvariantReport {
  ok: boolean;
  /** Writes settled by reconciliation after a crash, and writes whose execution had to be sent again. */
  reconciled: number;
  retried: number;
  /** One line per check: what held, or what did not. */
  checks: { name: string; ok: boolean; detail: string }[];
  writes: Record<string, number>;
}

/** Waits until no approval is left `executing` (reconciliation settles those a crash interrupted). */
async function settle(url: string, timeoutMs: number): Promise<number> {
  const db = await openDatabase({ url, pgliteDir: '', command: 'drill check' });
  try {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const row = (await db
        .knex('approval_requests')
        .where('status', 'executing')
        .count({ n: '*' })
        .first()) as {
        n: unknown;
      };
      const n = Number(row.n);
      if (n === 0 || Date.now() > until) return n;
      await sleep(500);
    }
  } finally {
    await db.close();
  }
}

/** An execution's terminal audit rows, and among them the connector's late answers (docs/design.md). */
const TERMINAL = "e.kind in ('write.succeeded', 'write.failed', 'write.unknown')";
const LATE = "coalesce(e.details->>'late', '') = 'true'";

/**
 * Whether an execution was settled exactly once and its status follows from its rows: one terminal row
 * that is not a late answer, then any late answers, each finding the status the one before left, and
 * changing it only from unknown to succeeded.
 */
function settledOnce(r: {
  status: string;
  terminal: string;
  terminal_kind: string | null;
  late_before: string[] | null;
  late_after: string[] | null;
}): boolean {
  if (Number(r.terminal) !== 1 || !r.terminal_kind?.startsWith('write.')) return false;
  let status = r.terminal_kind.slice('write.'.length);
  const before = r.late_before ?? [];
  const after = r.late_after ?? [];
  for (let i = 0; i < before.length; i++) {
    if (before[i] !== status) return false;
    if (after[i] !== status && !(status === 'unknown' && after[i] === 'succeeded')) return false;
    status = after[i]!;
  }
  return status === r.status;
}

/**
 * After a drill: every real write has exactly one write.started and one terminal row that matches its
 * status; no message was written twice and every succeeded write has its message; the chain and the
 * checkpoints verify (the real verifier); and no request got an unstructured answer.
 */
export async function checkInvariants(
  url: string,
  o: {
    tally: Tally;
    writes: WriteRecord[];
    settleMs: number;
    allowed: Outcome[];
    taskCalls?: TaskCallRecord[];
  },
): Promise<InvariantReport> {
  const checks: InvariantReport['checks'] = [];
  const check = (name: string, ok: boolean, detail: string) => checks.push({ name, ok, detail });

  const executing = await settle(url, o.settleMs);
  check('no execution left executing', executing === 0, `${executing} still executing`);

  let reconciled: number;
  const db = await openDatabase({ url, pgliteDir: '', command: 'drill check' });
  try {
    const rows = (await db.knex.raw(`
      select r.id, r.status, r.approval_id,
        count(e.seq) filter (where e.kind = 'write.started') as started,
        count(e.seq) filter (where ${TERMINAL} and not ${LATE}) as terminal,
        string_agg(e.kind, ',') filter (where ${TERMINAL} and not ${LATE}) as terminal_kind,
        count(e.seq) filter (where ${TERMINAL} and ${LATE}) as late,
        (array_agg(e.details->>'status_before' order by e.seq) filter (where ${TERMINAL} and ${LATE})) as late_before,
        (array_agg(e.details->>'status_after' order by e.seq) filter (where ${TERMINAL} and ${LATE})) as late_after,
        (select count(*) from messages m where m.write_key = r.approval_id::text) as messages
      from approval_requests r
      left join audit_events e on e.approval_request_id = r.id::text
      group by r.id, r.status, r.approval_id`)) as {
      rows: {
        id: string;
        status: string;
        started: string;
        terminal: string;
        terminal_kind: string | null;
        late: string;
        late_before: string[] | null;
        late_after: string[] | null;
        messages: string;
      }[];
    };
    const executed = rows.rows.filter((r) =>
      ['succeeded', 'failed', 'unknown', 'executing'].includes(r.status),
    );
    const badStart = executed.filter((r) => Number(r.started) !== 1);
    check(
      'exactly one write.started per real write',
      badStart.length === 0,
      `${executed.length} real writes; ${badStart.length} without exactly one (${badStart
        .slice(0, 3)
        .map((r) => `${r.id}: ${r.started}`)
        .join(', ')})`,
    );
    const badEnd = executed.filter((r) => !settledOnce(r));
    const lateAnswers = executed.reduce((n, r) => n + Number(r.late), 0);
    check(
      'exactly one terminal row, matching the status (late answers apart)',
      badEnd.length === 0,
      `${badEnd.length} without (${badEnd
        .slice(0, 3)
        .map((r) => `${r.id}: ${r.status} ${r.terminal_kind} late ${(r.late_after ?? []).join(',')}`)
        .join(', ')}); ${lateAnswers} late answers recorded`,
    );
    const startedUnexecuted = rows.rows.filter((r) => !executed.includes(r) && Number(r.started) > 0);
    check(
      'no write.started for a write never executed',
      startedUnexecuted.length === 0,
      `${startedUnexecuted.length} found`,
    );
    const twice = rows.rows.filter((r) => Number(r.messages) > 1);
    const missing = rows.rows.filter((r) => r.status === 'succeeded' && Number(r.messages) !== 1);
    const phantom = rows.rows.filter((r) => r.status === 'failed' && Number(r.messages) !== 0);
    check(
      'no message written twice; one per succeeded write, none for a failed one',
      twice.length + missing.length + phantom.length === 0,
      `${twice.length} twice, ${missing.length} succeeded without a message, ${phantom.length} failed with one`,
    );

    const byStatus = new Map(rows.rows.map((r) => [r.id, r.status]));
    const disagree = o.writes.filter(
      (w) =>
        w.approval_request_id &&
        ['succeeded', 'failed', 'unknown'].includes(w.status) &&
        byStatus.get(w.approval_request_id) !== w.status,
    );
    check(
      'what the agents were told is what the database holds',
      disagree.length === 0,
      `${disagree.length} disagree`,
    );

    const rec = (await db
      .knex('audit_events')
      .whereRaw(`details->>'reconciled' = 'true'`)
      .count({ n: '*' })
      .first()) as { n: unknown };
    reconciled = Number(rec.n);
    checks.push(...(await truthfulAnswers(db.knex, o.writes)));
    const verified = await verifyDatabase(db.knex);
    check('the audit chain and its checkpoints verify', verified.ok, verified.summary.replace(/\n/g, '; '));
  } finally {
    await db.close();
  }

  const sentTwice = o.writes.filter((w) => w.sent_answers > 1);
  const raced = o.writes.filter((w) => w.raced);
  check(
    'at most one execution answered sent per approval, however many raced',
    sentTwice.length === 0,
    `${raced.length} writes raced; ${sentTwice.length} answered sent more than once`,
  );

  const bad = (Object.keys(o.tally.counts) as Outcome[]).filter(
    (k) => !['ok', 'refused', 'protocol', 'http_problem', ...o.allowed].includes(k) && o.tally.counts[k] > 0,
  );
  check(
    'every answer was structured',
    bad.length === 0,
    `${JSON.stringify(o.tally.counts)}${o.tally.unstructuredExamples.length ? `; e.g. ${o.tally.unstructuredExamples.map((e) => e.slice(0, 160)).join(' | ')}` : ''}`,
  );

  if (o.taskCalls) checks.push(taskAnswersCheck(o.taskCalls));

  const writes: Record<string, number> = {};
  for (const w of o.writes) writes[w.status] = (writes[w.status] ?? 0) + 1;
  const retried = o.writes.filter((w) => w.execute_attempts > w.first_round).length;
  return { ok: checks.every((c) => c.ok), reconciled, retried, checks, writes };
}

/**
 * Approvals settled as not written (failed) that have a message all the same: a write that landed
 * after the server had concluded it never would. Checked once more after every fault has cleared.
 */
export async function phantomWrites(url: string): Promise<{ failed: number; phantom: string[] }> {
  const db = await openDatabase({ url, pgliteDir: '', command: 'drill check' });
  try {
    const { rows } = (await db.knex.raw(`
      select r.id, (select count(*) from messages m where m.write_key = r.approval_id::text) as messages
        from approval_requests r where r.status = 'failed'`)) as { rows: { id: string; messages: string }[] };
    return { failed: rows.length, phantom: rows.filter((r) => Number(r.messages) > 0).map((r) => r.id) };
  } finally {
    await db.close();
  }
}

type Check = InvariantReport['checks'][number];

/**
 * What an agent was told after a failure matches what was committed: no execution answered "not
 * completed" (SOURCE_UNAVAILABLE) whose write.started committed (the same trace id), and, once the
 * decisions have settled, no request left pending with as many approvals as it needs (a request under
 * a rule that names who may approve is counted by the server alone, and left out here).
 */
async function truthfulAnswers(knex: Knex, writes: WriteRecord[]): Promise<Check[]> {
  const traces = writes.flatMap((w) => w.not_completed);
  const started =
    traces.length === 0
      ? []
      : ((await knex('audit_events')
          .where({ kind: 'write.started' })
          .whereIn('trace_id', traces)
          .select('trace_id', 'approval_request_id')) as { trace_id: string }[]);
  const stuck = (await knex.raw(`
    select r.id, r.required_approvers,
      (select count(*) from approval_decisions d where d.approval_request_id = r.id and d.decision = 'approve') as approvals
    from approval_requests r
    where r.status = 'pending' and r.expires_at > now() and r.policy_requirement is null
      and (select count(*) from approval_decisions d where d.approval_request_id = r.id and d.decision = 'approve')
        >= r.required_approvers and r.required_approvers > 0`)) as { rows: { id: string }[] };
  return [
    {
      name: 'no "not completed" answer for an execution whose write.started committed',
      ok: started.length === 0,
      detail: `${traces.length} executions answered SOURCE_UNAVAILABLE; ${started.length} of them had started (${started
        .slice(0, 3)
        .map((r) => r.trace_id)
        .join(', ')})`,
    },
    {
      name: 'no request left pending with the approvals it needs',
      ok: stuck.rows.length === 0,
      detail: `${stuck.rows.length} found (${stuck.rows
        .slice(0, 3)
        .map((r) => r.id)
        .join(', ')})`,
    },
  ];
}

/** Every task-augmented call answered as the Tasks extension allows: a task or an error (or at once, on 2026-07-28). */
function taskAnswersCheck(calls: TaskCallRecord[]): Check {
  const counts: Record<string, number> = {};
  for (const c of calls) counts[`${c.revision} ${c.answer}`] = (counts[`${c.revision} ${c.answer}`] ?? 0) + 1;
  const bad = calls.filter((c) => c.answer === 'unreadable');
  return {
    name: 'every task-augmented call answered as a task or an extension error',
    ok: bad.length === 0 && calls.length > 0,
    detail: `${calls.length} calls: ${JSON.stringify(counts)}${
      bad.length
        ? `; e.g. ${bad
            .slice(0, 2)
            .map((b) => b.detail)
            .join(' | ')}`
        : ''
    }`,
  };
}
