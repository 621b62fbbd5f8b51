import client from 'prom-client';
import { createWaitAccount } from './waits.ts';

/**
 * How often the event loop's delay (nodejs_eventloop_lag_* series) is sampled. Each sample is the time
 * between two ticks of that timer, so the series sit at this value on an idle loop: the loop was held
 * for (figure - EVENT_LOOP_SAMPLE_MS), and a hold shorter than the period can fall between two ticks.
 */
export const EVENT_LOOP_SAMPLE_MS = 250;

/** Counters for /healthz and Prometheus series for /metrics; one registry per server, no globals. */
export function createMetrics() {
  const registry = new client.Registry();
  // The event loop's delay is sampled by a timer every eventLoopMonitoringPrecision ms: prom-client's
  // 10 ms woke an idle server 100 times a second (about 5 ms of CPU a second with no calls at all).
  client.collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLE_MS });
  const calls = new client.Counter({
    name: 'countersign_tool_calls_total',
    help: 'Tool calls by tool and outcome',
    labelNames: ['tool', 'result', 'error_code'],
    registers: [registry],
  });
  const latency = new client.Histogram({
    name: 'countersign_tool_call_seconds',
    help: 'Tool call latency, audit append included',
    labelNames: ['tool'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30],
    registers: [registry],
  });
  const counters = {
    calls: 0,
    errors: 0,
    overrun_calls: 0,
    late_results_discarded: 0,
    rate_limited_calls: 0,
    denied_calls: 0,
  };
  const overruns = new client.Counter({
    name: 'countersign_call_overruns_total',
    help: 'Calls past their deadline',
    registers: [registry],
  });
  const limited = new client.Counter({
    name: 'countersign_rate_limited_total',
    help: 'Calls refused by the rate limit',
    registers: [registry],
  });
  const denied = new client.Counter({
    name: 'countersign_denied_total',
    help: "Calls of tools the agent's profile denies",
    registers: [registry],
  });
  const statements = new client.Counter({
    name: 'countersign_db_statements_total',
    help: 'Statements sent to the database (round trips), transaction control included',
    registers: [registry],
  });

  return {
    registry,
    counters,
    /** Where calls wait: database statements, upstream requests, the event loop (waits.ts). */
    waits: createWaitAccount(registry),
    record(tool: string, errorCode: string | null, seconds: number) {
      counters.calls++;
      if (errorCode) counters.errors++;
      calls.inc({ tool, result: errorCode ? 'error' : 'ok', error_code: errorCode ?? '' });
      latency.observe({ tool }, seconds);
      if (errorCode === 'RATE_LIMITED') {
        counters.rate_limited_calls++;
        limited.inc();
      }
    },
    overrun() {
      counters.overrun_calls++;
      overruns.inc();
    },
    lateResult() {
      counters.late_results_discarded++;
    },
    denied() {
      counters.denied_calls++;
      denied.inc();
    },
    statement() {
      statements.inc();
    },
  };
}
export type Metrics = ReturnType<typeof createMetrics>;
