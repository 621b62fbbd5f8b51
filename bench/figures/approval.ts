import fs from 'node:fs';
import path from 'node:path';
import type { Client } from '@modelcontextprotocol/client';
import pg from 'pg';
import { compilePolicy, inputOf } from '../../src/approval/rules/index.ts';
import { figure, type Figure } from '../lib/report.ts';
import { callTool, connect, spawnCountersign } from '../lib/server.ts';
import { median, percentile } from '../lib/stats.ts';
import { ChairSession } from '../lib/web.ts';
import { TASK_POLL_MS, taskRounds } from './approval-task.ts';

export interface ApprovalOptions {
  url: string;
  dataDir: string;
  token: string;
  chair: { name: string; password: string };
  rounds: number;
  log(line: string): void;
}

const STEPS = ['dry_run', 'approve', 'get_approval', 'execute'] as const;

/**
 * The approval policy (e) runs under: four rules of the kinds docs/policy.md shows, none of which match
 * the bench's writes, then one that does and asks for the one chair the cycle has. Every dry run and
 * every execution evaluates all five.
 */
const RULES = {
  timezone: 'Europe/Berlin',
  rules: [
    {
      name: 'Never the press',
      when: 'content.normalized.contains("press release")',
      then: { deny: { reason: 'no' } },
    },
    {
      name: 'Payments over EUR 10,000',
      when: 'content.normalized.find("eur ?([0-9]+)") != "" && int(content.normalized.find("eur ?([0-9]+)")) > 10000',
      then: { require: { approvers: 2, roles: ['finance'] } },
    },
    {
      name: 'Large groups',
      when: 'target.group && target.member_count > 50',
      then: { require: { approvers: 2 } },
    },
    { name: 'Large files', when: 'content.file_size > 10485760', then: { require: { approvers: 2 } } },
    { name: 'One chair', when: 'tool == "send_message"', then: { require: { approvers: 1 } } },
  ],
};

/** Microseconds per decision of RULES on one write like the bench's, in this process (p50 of rounds). */
async function ruleEvaluationMicros(rounds: number): Promise<number[]> {
  const policy = compilePolicy(RULES, {});
  const facts = {
    tool: 'send_message',
    facet: 'send',
    target: { target_type: 'contact', target_id: 'ct_david', display_name: 'David' },
    text: 'Bench message 1 — נא לאשר',
    agent: { name: 'bench', owner: null },
  };
  const samples: number[] = [];
  for (let i = 0; i < rounds; i++) {
    const t0 = performance.now();
    // The input is built each time, as a call builds it (normalisation of the text included).
    await policy.decideInput(inputOf(facts, new Date(), RULES.timezone));
    samples.push((performance.now() - t0) * 1000);
  }
  return samples;
}

/** p50 of `n` plain INSERT round trips (autocommit, one row) on the same database. */
async function insertRoundTrips(url: string, n: number): Promise<number[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query('create table bench_insert (id bigserial primary key, body text not null)');
    const samples: number[] = [];
    for (let i = 0; i < n; i++) {
      const t0 = performance.now();
      await client.query('insert into bench_insert (body) values ($1)', [`row ${i}`]);
      samples.push(performance.now() - t0);
    }
    return samples;
  } finally {
    await client.end();
  }
}

/** The server's count of database statements so far (its /metrics, read over loopback). */
async function statementsSoFar(url: string): Promise<number> {
  const text = await (await fetch(new URL('/metrics', url))).text();
  const m = /^countersign_db_statements_total (\d+)/m.exec(text);
  if (!m) throw new Error('no countersign_db_statements_total in /metrics');
  return Number(m[1]);
}

type Steps = Record<(typeof STEPS)[number], number>;

/**
 * One write, end to end: the agent's dry run, the chair's approval through the review form, the
 * agent's get_approval and the real execution. Each step's value is what `mark` measured after it
 * minus before it: milliseconds, or the server's statement count.
 */
async function cycle(
  i: number,
  agent: Client,
  chair: ChairSession,
  mark: () => Promise<number> | number,
): Promise<Steps> {
  const args = {
    target_type: 'contact',
    target_id: 'ct_david',
    content_text: `Bench message ${i} — נא לאשר`,
  };
  const t = [await mark()];
  const draft = await callTool(agent, 'isphere_send_message', args);
  const approval = draft.envelope.approval as { approval_request_id: string } | undefined;
  if (!approval) throw new Error(`dry run failed: ${JSON.stringify(draft.envelope.error)}`);
  t.push(await mark());
  await chair.approve(approval.approval_request_id);
  t.push(await mark());
  const got = await callTool(agent, 'isphere_get_approval', {
    approval_request_id: approval.approval_request_id,
  });
  const approvalId = (got.envelope.approval as { approval_id: string | null } | undefined)?.approval_id;
  if (!approvalId) throw new Error(`no approval_id after approval: ${JSON.stringify(got.envelope)}`);
  t.push(await mark());
  const sent = await callTool(agent, 'isphere_send_message', {
    ...args,
    dry_run: false,
    approval_id: approvalId,
  });
  if (sent.envelope.send_status !== 'sent')
    throw new Error(`execution failed: ${JSON.stringify(sent.envelope)}`);
  t.push(await mark());
  return Object.fromEntries(STEPS.map((s, k) => [s, t[k + 1]! - t[k]!])) as Steps;
}

/**
 * (e) the machine time of one write, end to end, against one plain INSERT round trip; the human's
 * reading time is not in it, everything the machines do is. Then, in rounds of their own (reading
 * /metrics between steps would add to the times), the database statements each step sent.
 */
export async function approvalFigures(o: ApprovalOptions): Promise<Figure[]> {
  const configFile = path.join(o.dataDir, 'bench-approval-rules.json');
  fs.writeFileSync(configFile, JSON.stringify({ approval: { rules: RULES } }));
  const server = await spawnCountersign({
    DATABASE_URL: o.url,
    COUNTERSIGN_DATA_DIR: o.dataDir,
    COUNTERSIGN_CONFIG: configFile,
  });
  try {
    const agent = await connect(server.url, o.token);
    const chair = new ChairSession(server.url);
    await chair.login(o.chair.name, o.chair.password);
    const totals: number[] = [];
    const steps: Record<(typeof STEPS)[number], number[]> = {
      dry_run: [],
      approve: [],
      get_approval: [],
      execute: [],
    };
    const warmup = Math.min(10, Math.ceil(o.rounds / 5));
    for (let i = 0; i < warmup + o.rounds; i++) {
      const ms = await cycle(i, agent, chair, () => performance.now());
      if (i < warmup) continue;
      totals.push(STEPS.reduce((sum, s) => sum + ms[s], 0));
      for (const s of STEPS) steps[s].push(ms[s]);
    }
    const counts: Record<(typeof STEPS)[number], number[]> = {
      dry_run: [],
      approve: [],
      get_approval: [],
      execute: [],
    };
    for (let i = 0; i < 10; i++) {
      const n = await cycle(warmup + o.rounds + i, agent, chair, () => statementsSoFar(server.url));
      for (const s of STEPS) counts[s].push(n[s]);
    }
    await agent.close();
    const task = await taskRounds(server.url, o.token, chair, o.rounds, 10 * (warmup + o.rounds));
    const pushed = await taskRounds(server.url, o.token, chair, o.rounds, 20 * (warmup + o.rounds), 'push');
    const insert = await insertRoundTrips(o.url, Math.max(200, o.rounds));
    const breakdown = STEPS.map((s) => `${s} ${median(steps[s]).toFixed(1)}`).join(', ');
    const statements = STEPS.map((s) => `${s} ${median(counts[s])}`).join(', ');
    const cycleStatements = STEPS.reduce((sum, s) => sum + median(counts[s]), 0);
    o.log(
      `  p50 ${median(totals).toFixed(1)} ms (${breakdown} ms); one INSERT p50 ${median(insert).toFixed(2)} ms`,
    );
    o.log(`  database statements per step (median of 10 cycles): ${statements}; cycle ${cycleStatements}`);
    const micros = await ruleEvaluationMicros(20_000);
    o.log(
      `  approval rules: ${RULES.rules.length} evaluated per call, p50 ${median(micros).toFixed(1)} µs in process`,
    );
    o.log(
      `  as a task: p50 ${task.p50.toFixed(1)} ms (${task.breakdown} ms; tasks/get every ${TASK_POLL_MS} ms)`,
    );
    o.log(
      `  as a task, pushed: p50 ${pushed.p50.toFixed(1)} ms (${pushed.breakdown} ms; on a listen stream)`,
    );
    return [
      figure({
        id: 'e_approval_roundtrip_p50_ms',
        unit: 'ms',
        value: median(totals),
        baseline: median(insert),
        baseline_label: 'one plain INSERT round trip (p50)',
        check: { valueAtMost: 30 },
        note: `${o.rounds} writes; p50 per step: ${breakdown} ms`,
      }),
      figure({
        id: 'e_approval_roundtrip_p99_ms',
        unit: 'ms',
        value: percentile(totals, 99),
        baseline: percentile(insert, 99),
        baseline_label: 'one plain INSERT round trip (p99)',
        check: null,
      }),
      figure({
        id: 'e_task_roundtrip_p50_ms',
        unit: 'ms',
        value: task.p50,
        baseline: median(insert),
        baseline_label: 'one plain INSERT round trip (p50)',
        check: null,
        note: `${o.rounds} writes asked as tasks, create → approve → completed from the client (tasks/get every ${TASK_POLL_MS} ms); p50 per step: ${task.breakdown} ms`,
      }),
      figure({
        id: 'e_task_roundtrip_p99_ms',
        unit: 'ms',
        value: task.p99,
        baseline: percentile(insert, 99),
        baseline_label: 'one plain INSERT round trip (p99)',
        check: null,
      }),
      figure({
        id: 'e_task_pushed_roundtrip_p50_ms',
        unit: 'ms',
        value: pushed.p50,
        baseline: median(insert),
        baseline_label: 'one plain INSERT round trip (p50)',
        check: null,
        note: `${o.rounds} writes asked as tasks, create → approve → completed pushed as notifications/tasks on a listen stream opened after the create; p50 per step: ${pushed.breakdown} ms`,
      }),
      figure({
        id: 'e_approval_cycle_statements',
        unit: 'statements',
        value: cycleStatements,
        check: { valueAtMost: 15 },
        note: `database round trips per step: ${statements}`,
      }),
      figure({
        id: 'e_approval_rules_eval_us',
        unit: 'µs',
        value: median(micros),
        check: null,
        note: `${RULES.rules.length} CEL rules decided per dry run and execution (the cycle above runs under them)`,
      }),
    ];
  } finally {
    await server.stop();
  }
}
