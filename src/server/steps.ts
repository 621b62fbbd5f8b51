import { hash, randomUUID } from 'node:crypto';
import canonicalize from 'canonicalize';
import { ProtocolError, ProtocolErrorCode } from '@modelcontextprotocol/server';
import type { CallToolResult } from '@modelcontextprotocol/server';
import type { z } from 'zod';
import { runWrite } from '../approval/gate.ts';
import type { Approvals } from '../approval/index.ts';
import { isAuditUnavailable, type AuditLog } from '../audit/log.ts';
import type { Config } from '../config.ts';
import type { ConnectorSet } from '../connectors/index.ts';
import type { BlobStore } from '../connectors/local/blobs.ts';
import { AppError, toolCodeOf, type AuditErrorCode } from '../core/errors.ts';
import type { Faults } from '../core/faults.ts';
import type { Agent } from '../core/identity.ts';
import { isConnectionError } from '../db/knex.ts';
import type { Logger } from '../log.ts';
import type { CursorCodec } from '../tools/cursor.ts';
import { toCallResult, type Settled } from '../tools/envelope.ts';
import type { MemoryStore } from '../tools/memory/store.ts';
import type { AnyToolDef, ToolOutcome } from '../tools/types.ts';
import { isOverrun, withDeadline } from './deadline.ts';
import type { Metrics } from './metrics.ts';
import type { AnswerHold } from './answer-hold.ts';
import type { Profile } from './profiles.ts';
import type { RateLimiter } from './rate-limit.ts';
import { newTraceId } from '../core/ids.ts';
import { traced, type Tracer } from '../core/tracing.ts';

/** What the call steps use. Built once per process (src/app/services.ts). */
export interface StepDeps {
  audit: AuditLog;
  connectors: ConnectorSet;
  cursors: CursorCodec;
  approvals: Approvals;
  blobs: BlobStore;
  memory: MemoryStore;
  /** Calls per agent per minute, counted across the cluster. */
  limiter: RateLimiter;
  profiles: ReadonlyMap<string, Profile>;
  metrics: Metrics;
  config: Config;
  log: Logger;
  /** Test hooks; production wiring never provides them. */
  faults?: Faults;
  /** Set when tracing is on (an OTLP endpoint is configured); the steps then run in child spans. */
  tracer?: Tracer;
}

/** One tools/call as it moves through the steps. */
export interface Call {
  agent: Agent;
  /** The tool name as the agent sent it. */
  name: string;
  args: unknown;
  signal: AbortSignal;
  request_id: string;
  trace_id: string;
  started: Date;
  /** Of the canonical arguments; null when they are nested too deep to canonicalise safely. */
  args_sha256: string | null;
  /** Set once the catalogue knows no such tool: the name is then stored cut, with its digest. */
  unknown?: true;
}

/** How much of an unknown tool's name is stored and echoed; the rest is known by its SHA-256. */
export const MAX_UNKNOWN_TOOL_NAME = 200;

/** The one metrics label every unknown tool name is counted under, so no caller can grow /metrics. */
export const UNKNOWN_TOOL_LABEL = '(unknown)';

/** The call, marked as naming no tool in the catalogue. */
export const asUnknownTool = (call: Call): Call => ({ ...call, unknown: true });

/** The tool name as rows, answers and logs carry it: an unknown name cut to MAX_UNKNOWN_TOOL_NAME. */
export const toolNameOf = (call: Call) =>
  call.unknown ? call.name.slice(0, MAX_UNKNOWN_TOOL_NAME) : call.name;

/** The tool label a call is counted under in /metrics. */
export const metricLabelOf = (call: Call) => (call.unknown ? UNKNOWN_TOOL_LABEL : call.name);

/** Arguments nested deeper than this are refused before any step walks them (SPEC §4, INVALID_ARGUMENT). */
export const MAX_ARGUMENT_DEPTH = 32;

/** What the HTTP transport hands on in place of arguments too deep for the SDK to walk (server/http.ts). */
const STAND_IN_KEY = '\u0000countersign';
export const TOO_DEEP_ARGUMENTS = Object.freeze({ [STAND_IN_KEY]: 'arguments nested too deep' });

/** Whether arguments are the transport's stand-in, or nest deeper than the limit (one walk, no recursion). */
function tooDeep(args: unknown): boolean {
  const standIn =
    typeof args === 'object' && args !== null && STAND_IN_KEY in args && Object.keys(args).length === 1;
  return standIn || nestedDeeperThan(args, MAX_ARGUMENT_DEPTH);
}

/** `trace_id` is the call's span's trace id when tracing is on. */
export function beginCall(
  agent: Agent,
  name: string,
  args: unknown,
  signal: AbortSignal,
  trace_id = newTraceId(),
): Call {
  const given = args ?? {};
  return {
    agent,
    name,
    args: given,
    signal,
    request_id: randomUUID(),
    trace_id,
    started: new Date(),
    args_sha256: tooDeep(given) ? null : hash('sha256', canonicalize(given) ?? '', 'hex'),
  };
}

const seconds = (call: Call) => (Date.now() - call.started.getTime()) / 1000;

/** The fields every row of a call carries; `details` (given) with the agent's name. */
const callRow = (call: Call, details: Record<string, unknown>) => ({
  kind: 'tool.call' as const,
  request_id: call.request_id,
  trace_id: call.trace_id,
  agent_id: call.agent.id,
  tool: toolNameOf(call),
  details: {
    ...details,
    ...(call.unknown ? { tool_sha256: hash('sha256', call.name, 'hex') } : {}),
    agent_name: call.agent.name,
  },
});

/** The audit append, in an `audit.append` span when tracing is on (src/audit/log.ts stays untouched). */
const append = (deps: StepDeps, ...[row, onChained]: Parameters<AuditLog['append']>) =>
  traced(deps.tracer, 'audit.append', { 'countersign.audit.kind': row.kind }, () =>
    deps.audit.append(row, onChained),
  );

/** A crash as SPEC §4 answers it: -32603 with the trace id, and no stack trace. */
export const internalError = (trace_id: string) => ({
  rpc: ProtocolErrorCode.InternalError,
  message: `Internal error (trace_id ${trace_id})`,
  data: { code: 'INTERNAL' },
});

/** An error answered as a JSON-RPC error, after its audit row is written and it is counted. */
async function protocolError(
  deps: StepDeps,
  call: Call,
  e: { audit: AuditErrorCode; rpc: number; message: string; data: Record<string, unknown> },
) {
  await append(deps, {
    ...callRow(call, { args_sha256: call.args_sha256 }),
    result: 'error',
    error_code: e.audit,
  });
  deps.metrics.record(metricLabelOf(call), e.audit, seconds(call));
  return new ProtocolError(e.rpc, e.message, { ...e.data, trace_id: call.trace_id });
}

/**
 * An error that escaped the steps (a database error while auditing or admitting, a bug): -32603 with
 * data.code INTERNAL and the trace id, logged and audited — never the error's own text. Protocol errors
 * and an unavailable audit log pass through as they are (outage answers the latter).
 */
export async function crashed(deps: StepDeps, call: Call, err: unknown): Promise<unknown> {
  if (err instanceof ProtocolError || isAuditUnavailable(err)) return err;
  deps.log.error(
    { err, trace_id: call.trace_id, tool: toolNameOf(call), agent: call.agent.name },
    'call failed',
  );
  try {
    return await protocolError(deps, call, { audit: 'INTERNAL_ERROR', ...internalError(call.trace_id) });
  } catch (again) {
    if (isAuditUnavailable(again)) return again;
    const { rpc, message, data } = internalError(call.trace_id);
    return new ProtocolError(rpc, message, { ...data, trace_id: call.trace_id });
  }
}

/** A name that is neither a tool nor an upstream's: -32602, audited (the name cut, with its digest). */
export async function refuseUnknownTool(deps: StepDeps, call: Call): Promise<never> {
  throw await protocolError(deps, call, {
    audit: 'UNKNOWN_TOOL',
    rpc: ProtocolErrorCode.InvalidParams,
    message: `Unknown tool: ${toolNameOf(call)}`,
    data: { code: 'UNKNOWN_TOOL' },
  });
}

/** The agent's profile must allow the tool's facet; a denial is a protocol error with the profile's reason. */
export async function admit(deps: StepDeps, call: Call, tool: AnyToolDef): Promise<Profile> {
  const profile = deps.profiles.get(call.agent.profile);
  if (profile?.allowed.has(tool.facet)) return profile;
  const reason = profile
    ? (profile.deny[tool.facet] ?? `the ${tool.facet} facet is not allowed`)
    : `this agent's profile "${call.agent.profile}" is not installed on this server`;
  await append(deps, {
    ...callRow(call, { facet: tool.facet, profile: call.agent.profile, reason }),
    kind: 'auth.denied',
    result: 'error',
    error_code: 'TOOL_DENIED',
  });
  deps.metrics.denied();
  // SPEC §4 says -32002; SDK v2 answers any handler's -32002 as -32602 on every revision (2026-07-28
  // reserves -32002), so it is said as it will be sent. data.code TOOL_DENIED tells it apart.
  throw new ProtocolError(
    ProtocolErrorCode.InvalidParams,
    `Tool ${call.name} is not available to this agent: ${reason}`,
    {
      code: 'TOOL_DENIED',
      reason,
      trace_id: call.trace_id,
    },
  );
}

/**
 * Counts the call against the agent's per-minute limit; over it, the RATE_LIMITED failure with when to
 * retry, else undefined. Taken before anything else looks at the call, so calls of unknown or denied
 * tools count too.
 */
export async function takeRate(deps: StepDeps, call: Call): Promise<AppError | undefined> {
  const wait = await traced(deps.tracer, 'rate_limit.take', {}, () =>
    deps.limiter.take(call.agent.id, call.agent.rate_limit_per_min ?? deps.config.policy.rate_limit_per_min),
  );
  if (wait <= 0) return undefined;
  return new AppError('RATE_LIMITED', `too many calls: retry in ${wait} s`, 'rate_limited', {
    details: { retry_after_s: wait },
  });
}

/** The arguments as the tool's input schema reads them, or INVALID_ARGUMENT naming the first problem. */
export function validate(tool: AnyToolDef, call: Call): Record<string, unknown> {
  if (call.args_sha256 === null) {
    throw new AppError(
      'INVALID_ARGUMENT',
      `arguments: nested deeper than ${MAX_ARGUMENT_DEPTH} levels`,
      'too_deep',
    );
  }
  const nul = nulPath(call.args, 'arguments');
  if (nul) {
    throw new AppError(
      'INVALID_ARGUMENT',
      `${nul.replace(/^arguments\./, '')}: contains a NUL byte`,
      'nul_byte',
    );
  }
  const parsed = tool.input.safeParse(call.args);
  if (!parsed.success) {
    throw new AppError('INVALID_ARGUMENT', describeIssue(parsed.error.issues[0]!), 'invalid_argument', {
      details: { issues: parsed.error.issues.map(describeIssue) },
    });
  }
  return parsed.data as Record<string, unknown>;
}

/**
 * The tool's own work under the call deadline, with the context its kind may reach: a read tool cannot
 * reach approval decisions, a memory tool only the agent's notes, and a write goes through the gate.
 * A result that arrives after the deadline is thrown away, and counted.
 */
export function runHandler(
  deps: StepDeps,
  call: Call,
  tool: AnyToolDef,
  profile: Profile,
  args: Record<string, unknown>,
): Promise<ToolOutcome<Record<string, unknown>>> {
  const run = async (signal: AbortSignal): Promise<ToolOutcome<Record<string, unknown>>> => {
    await deps.faults?.at('before_handler');
    const base = { agent: call.agent, request_id: call.request_id, trace_id: call.trace_id, signal };
    const { connectors, config, blobs } = deps;
    if (tool.kind === 'write') {
      const preparing = tool.prepare(args, { ...base, connectors, config, blobs });
      return runWrite(tool.name, preparing, args as { dry_run: boolean }, {
        ...base,
        dryRunOnly: profile.dry_run_only.includes(tool.facet),
        getApprovalTool: `${config.tools.prefix}get_approval`,
        approvals: deps.approvals,
        faults: deps.faults,
      });
    }
    if (tool.facet === 'memory') return tool.handler(args, { ...base, memory: deps.memory });
    return tool.handler(args, {
      ...base,
      connectors,
      config,
      blobs,
      cursors: deps.cursors,
      approvals: deps.approvals,
    });
  };
  return withDeadline(call.signal, deps.config.limits.call_timeout_ms, run, () => deps.metrics.lateResult());
}

/**
 * What a thrown error becomes: a tool failure (AppError, answered in the envelope), or a protocol error
 * for a call over its deadline (-32001) or a crash (-32603, with a trace_id and no stack).
 */
export async function asFailure(deps: StepDeps, call: Call, err: unknown): Promise<AppError> {
  if (isOverrun(err)) {
    deps.metrics.overrun();
    // A write past write.started stays `executing` until reconciliation settles it: never "not sent".
    throw await protocolError(deps, call, {
      audit: 'CALL_TIMEOUT',
      rpc: -32001,
      message: `Call exceeded its deadline of ${deps.config.limits.call_timeout_ms} ms`,
      data: { code: 'CALL_TIMEOUT' },
    });
  }
  // The database went away under the handler: said as such, and audited if it is back in time.
  if (isAuditUnavailable(err) || isConnectionError(err)) {
    return new AppError(
      'SOURCE_UNAVAILABLE',
      'the database is unavailable; retry shortly',
      'database_unavailable',
      {
        details: { retry_after_s: 1 },
      },
    );
  }
  if (err instanceof AppError) return err;
  deps.log.error(
    { err, trace_id: call.trace_id, tool: call.name, agent: call.agent.name },
    'tool handler crashed',
  );
  throw await protocolError(deps, call, { audit: 'INTERNAL_ERROR', ...internalError(call.trace_id) });
}

/** A call's result built for the seq its row was chained with. */
interface Built {
  seq: number;
  result: CallToolResult;
}

/**
 * Appends the call's audit row, counts it, and wraps the outcome in the envelope (audit_seq included).
 * The envelope is built while the row commits, from the row as chained (rebuilt if it was chained
 * anew). With a `hold`, the result is returned before the commit, which the hold then carries: the
 * transport sends the answer only once the row is committed (AnswerHold).
 */
export async function record(
  deps: StepDeps,
  call: Call,
  settled: Settled,
  hold?: AnswerHold,
): Promise<CallToolResult> {
  const facts = settled.outcome?.audit ?? {};
  const failure = settled.failure;
  const answer = (audit_seq: number) =>
    toCallResult(
      {
        tool: toolNameOf(call),
        request_id: call.request_id,
        trace_id: call.trace_id,
        operator_id: call.agent.id,
        started: call.started,
        audit_seq,
      },
      settled,
    );
  /** The result built from the row as chained, while it commits. */
  let early: Built | undefined;
  let built = (_: Built) => {};
  const announced = new Promise<Built>((resolve) => (built = resolve));
  const committed = append(
    deps,
    {
      ...callRow(call, {
        args_sha256: call.args_sha256,
        duration_ms: Date.now() - call.started.getTime(),
        ...(failure ? { reason: failure.reason ?? null } : {}),
        ...facts.details,
      }),
      source: facts.source ?? null,
      target_type: facts.target_type ?? null,
      target_ref: facts.target_ref ?? null,
      approval_id: facts.approval_id ?? null,
      dry_run: facts.dry_run ?? false,
      content_sha256: facts.content_sha256 ?? null,
      file_sha256: facts.file_sha256 ?? null,
      result: failure ? 'error' : 'ok',
      error_code: failure ? toolCodeOf(failure) : null,
    },
    (row) => built((early = { seq: row.seq, result: answer(row.seq) })),
  ).then((row) => {
    // Timed at the commit, counted once the answer is on its way: no part of the call's path.
    const took = seconds(call);
    setImmediate(() => deps.metrics.record(metricLabelOf(call), failure ? toolCodeOf(failure) : null, took));
    return row;
  });
  if (hold) {
    // Announced before committed: the result goes now, the commit to the hold.
    const sent = await Promise.race([announced, committed.then(() => undefined)]);
    if (sent) {
      hold.until(committed.then((row) => (row.seq === sent.seq ? undefined : answer(row.seq))));
      return sent.result;
    }
  }
  const row = await committed;
  return early?.seq === row.seq ? early.result : answer(row.seq);
}

function describeIssue(issue: z.core.$ZodIssue): string {
  const where = issue.path.length > 0 ? issue.path.join('.') : 'arguments';
  return `${where}: ${issue.message}`;
}

/** Whether objects or arrays nest deeper than `limit` levels; iterative, so no depth can overflow it. */
export function nestedDeeperThan(value: unknown, limit: number): boolean {
  const pending: [unknown, number][] = [[value, 1]];
  while (pending.length > 0) {
    const [v, depth] = pending.pop()!;
    if (v === null || typeof v !== 'object') continue;
    if (depth > limit) return true;
    for (const child of Object.values(v)) pending.push([child, depth + 1]);
  }
  return false;
}

/** The path of the first string (or key) holding a NUL byte, which no PostgreSQL text can store. */
function nulPath(value: unknown, path: string): string | undefined {
  if (typeof value === 'string') return value.includes('\0') ? path : undefined;
  if (Array.isArray(value)) {
    for (const [i, v] of value.entries()) {
      const found = nulPath(v, `${path}.${i}`);
      if (found) return found;
    }
  } else if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      const found = k.includes('\0') ? `${path}.${k}` : nulPath(v, `${path}.${k}`);
      if (found) return found;
    }
  }
  return undefined;
}
