import { hash, randomUUID } from 'node:crypto';
import canonicalize from 'canonicalize';
import { ProtocolError } from '@modelcontextprotocol/server';
import type { CallToolResult, Tool } from '@modelcontextprotocol/server';
import type { z } from 'zod';
import { runWrite } from '../approval/index.ts';
import type { SeamApprovals, TaskView } from '../approval/index.ts';
import type { AuditLog, Pace } from '../audit/index.ts';
import type { Config } from '../config.ts';
import type { ConnectorSet, BlobStore, Upstream } from '../connectors/index.ts';
import { factColumns } from '../core/audit-kinds.ts';
import { systemClock, type Clock } from '../core/clock.ts';
import { ANSWERS, type Refusal } from '../core/answers.ts';
import { AppError, toolCodeOf } from '../core/errors.ts';
import type { Faults } from '../core/faults.ts';
import type { Agent } from '../core/identity.ts';
import { closestName } from '../core/closest.ts';
import { newTraceId } from '../core/ids.ts';
import {
  cutText,
  escapeDeep,
  escapeText,
  findUnsafeText,
  unsafeText,
  type UnsafeInput,
} from '../core/safe-text.ts';
import { traced, type Tracer } from '../core/tracing.ts';
import { outageOf } from '../db/outage.ts';
import type { Logger } from '../log.ts';
import {
  toCallResult,
  type AnyToolDef,
  type CursorCodec,
  type MemoryStore,
  type Settled,
  type ToolOutcome,
} from '../tools/index.ts';
import { createProgress, outageAnswer, stageCode, stageOf, wireError } from './answer.ts';
import type { AnswerHold } from './call-context.ts';
import { createCatalogue, type Catalogue } from './catalogue.ts';
import { isOverrun, withDeadline } from './deadline.ts';
import type { Metrics } from './metrics.ts';
import type { RateLimiter } from '../accounts/index.ts';
import type { Profile } from '../core/profiles.ts';
import { failIfToolError } from './tracing.ts';

/*
 * The call seam: every tools/call, whatever transport brought it, runs through `runCall` below, and
 * this file reads in the order a call moves:
 *
 *   1. begin     the call's own context: caller, name, arguments and their digest, ids, answer hold
 *   2. rate      the agent's per-minute limit, before anything else looks at the call, so that calls of
 *                unknown or denied tools count too
 *   3. lookup    the name in the catalogue: unknown (-32602, the name stored cut), or an upstream that is
 *                down (SOURCE_UNAVAILABLE)
 *   4. admit     the agent's profile allows the tool's facet (else -32602, data.code TOOL_DENIED)
 *   5. validate  the arguments against the tool's input schema (INVALID_ARGUMENT)
 *   6. handle    the tool's own work under the call deadline; a write through the approval gate (a real
 *                write asked as an MCP task is drafted there and answered with the task: TaskCall)
 *   7. record    the call's audit row, committed before the answer leaves; then the envelope
 *
 * Failures of 2, 5 and 6 are the tool's answer (an envelope with ok: false); every other failure is a
 * protocol error. Every row a call writes goes through `appendCallRow`; every outage (outageOf) ends in
 * `outage`, answered -32003, so that nothing is answered as done without its row.
 */

/** What the seam uses. Built once per process (src/app/services.ts). */
export interface CallDeps {
  tools: readonly AnyToolDef[];
  /** Upstream MCP servers whose tools are re-exposed as `<upstream>__<tool>`; their lists change at run time. */
  upstreams?: readonly Upstream[];
  audit: AuditLog;
  connectors: ConnectorSet;
  cursors: CursorCodec;
  /** What the seam uses of the approvals (approval/approvals.ts, SeamApprovals). */
  approvals: SeamApprovals;
  blobs: BlobStore;
  memory: MemoryStore;
  /** Calls per agent per minute, counted across the cluster. */
  limiter: RateLimiter;
  /** How fast an agent past its limit is answered RATE_LIMITED, keyed by agent id (policy.rate_limited_per_second). */
  rateLimitedPace?: Pace;
  profiles: ReadonlyMap<string, Profile>;
  metrics: Metrics;
  config: Config;
  log: Logger;
  /** Test hooks; production wiring never provides them. */
  faults?: Faults;
  /** Set when tracing is on (an OTLP endpoint is configured); the steps then run in child spans. */
  tracer?: Tracer;
  /** The calls' clock (started_at, finished_at, durations); the system's unless a test gives its own. */
  clock?: Clock;
  /** The tools on offer; built from `tools` and `upstreams` unless a test gives its own (a twin). */
  catalogue?: Catalogue;
}

/**
 * How a call takes part in MCP tasks: `asTask` when the client declared the Tasks extension (a real
 * write without an approval_id is then answered with a CreateTaskResult), `task_id` when the task
 * runner makes the call to execute an approved task's write.
 */
export interface TaskCall {
  asTask?: boolean;
  task_id?: string;
}

export interface CallPipeline {
  listTools(agent: Agent): Tool[];
  /**
   * Runs one tools/call. Tool failures come back as `isError` results; protocol errors are thrown. With
   * a `hold` (a transport that can hold the answer), the result may come back before its audit row has
   * committed, the commit then in the hold (AnswerHold); with tracing on, it never does.
   */
  call(
    agent: Agent,
    name: string,
    args: unknown,
    signal: AbortSignal,
    hold?: AnswerHold,
    tasks?: TaskCall,
  ): Promise<CallToolResult>;
  /** Calls `listener` whenever the tool list changed (an upstream's tools); returns the unsubscribe. */
  onListChanged(listener: () => void): () => void;
  /** Set when tracing is on: the transport opens each request's span with it. */
  readonly tracer?: Tracer;
  /** The agents' tasks, as the tasks methods read, list and cancel them (approval/tasks.ts). */
  readonly tasks: Pick<SeamApprovals['tasks'], 'get' | 'getMany' | 'cancel'> & {
    /** The agent's tasks, newest first, a page after `cursor` (tamper-checked, bound to the agent). */
    list(agent: Agent, cursor?: string): Promise<{ items: TaskView[]; next_cursor: string | null }>;
  };
}

/** One tools/call as it moves through the steps: its typed context, from begin to record. */
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
  /**
   * The first argument (string or key) that cannot be stored or hashed as given (a NUL, a lone
   * surrogate): validation refuses it, and every row of the call records it escaped.
   */
  unsafe?: UnsafeInput;
  /** Where the transport holds the answer until the row commits, if it can (see AnswerHold). */
  hold?: AnswerHold;
  /** The call's part in MCP tasks, if it has one. */
  tasks?: TaskCall;
  /** How far the call's write got, as committed (filled in by the gate): what an outage answers by. */
  progress: ReturnType<typeof createProgress>;
}

export function createCallPipeline(deps: CallDeps): CallPipeline {
  const catalogue = deps.catalogue ?? createCatalogue({ ...deps, upstreams: deps.upstreams ?? [] });
  return {
    listTools: (agent) => catalogue.listFor(deps.profiles.get(agent.profile)),
    // Chosen once: without tracing, a call takes exactly the path it always took.
    call: deps.tracer
      ? tracedCall(deps, catalogue, deps.tracer)
      : (agent, name, args, signal, hold, tasks) =>
          runCall(deps, catalogue, beginCall(now(deps), { agent, name, args, signal, hold, tasks })),
    onListChanged: catalogue.onChanged,
    tracer: deps.tracer,
    tasks: {
      get: deps.approvals.tasks.get,
      getMany: deps.approvals.tasks.getMany,
      cancel: deps.approvals.tasks.cancel,
      list: (agent, cursor) =>
        deps.cursors.page<TaskView, { t: string; id: string }>(
          'tasks/list',
          { agent: agent.id },
          cursor,
          (after) => deps.approvals.tasks.list(agent, { limit: TASK_LIST_PAGE, after }),
        ),
    },
  };
}

/** How many tasks a page of tasks/list holds. */
const TASK_LIST_PAGE = 100;

/** The steps, in order. */
async function runCall(deps: CallDeps, catalogue: Catalogue, call: Call): Promise<CallToolResult> {
  // What the call settled as, once it has: an outage that then loses its audit row answers by it.
  let settled: Settled | undefined;
  call = holdingFailures(deps, call, () => settled);
  try {
    // 2. The limiter's own failure (the database gone) is the call's answer, as a handler's would be.
    const limited = await takeRate(deps, call).catch(failureOf);
    if (limited && !(limited instanceof AppError)) throw await wireFailure(deps, call, limited);
    // 3.
    const entry = catalogue.lookup(call.name);
    if (entry.kind === 'unknown') call = { ...call, unknown: true };
    if (limited) return await record(deps, call, { failure: limited });
    if (entry.kind === 'unknown') return await refuseUnknownTool(deps, call, catalogue);
    if (entry.kind === 'down') return await record(deps, call, { failure: entry.upstream.unavailable() });
    // 4.
    const profile = await admit(deps, call, entry.tool);
    // 5 and 6: their failures are the tool's answer.
    try {
      const args = validate(entry.tool, call);
      settled = { outcome: await handle(deps, call, entry.tool, profile, args) };
    } catch (err) {
      const failure = failureOf(err);
      if (!(failure instanceof AppError)) throw await wireFailure(deps, call, failure);
      settled = { failure };
    }
    // 7.
    return await record(deps, call, settled);
  } catch (err) {
    throw outage(deps, call, await crashed(deps, call, err), settled);
  }
}

/**
 * A call in its `execute_tool {tool}` span (the GenAI conventions' tool execution), a child of the
 * request's span; the envelope's trace_id is the span's trace id, and a failure its error.type. No
 * answer is held: the span ends once the row has committed.
 */
function tracedCall(deps: CallDeps, catalogue: Catalogue, tracer: Tracer): CallPipeline['call'] {
  return (agent, name, args, signal, _hold, tasks) =>
    tracer.span(
      `execute_tool ${name}`,
      { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': name },
      async (span) => {
        const call = beginCall(now(deps), { agent, name, args, signal, tasks }, span.traceId);
        span.set({ 'gen_ai.tool.call.id': call.request_id, 'countersign.agent.id': agent.id });
        const result = await runCall(deps, catalogue, call);
        failIfToolError(span, result);
        return result;
      },
    );
}

// ---- 1. begin ----------------------------------------------------------------------------------

/** Arguments nested deeper than this are refused before any step walks them (INVALID_ARGUMENT). */
export const MAX_ARGUMENT_DEPTH = 32;

/** What the HTTP transport hands on in place of arguments too deep for the SDK to walk (server/http.ts). */
const STAND_IN_KEY = '\u0000countersign';
export const TOO_DEEP_ARGUMENTS = Object.freeze({ [STAND_IN_KEY]: 'arguments nested too deep' });

/** `trace_id` is the call's span's trace id when tracing is on. */
function beginCall(
  started: Date,
  given: Pick<Call, 'agent' | 'name' | 'args' | 'signal' | 'hold' | 'tasks'>,
  trace_id = newTraceId(),
): Call {
  const args = given.args ?? {};
  const deep = tooDeep(args);
  const unsafe = deep ? undefined : findUnsafeText(args, 'arguments');
  return {
    ...given,
    args,
    progress: createProgress(),
    request_id: randomUUID(),
    trace_id,
    started,
    // Arguments holding text RFC 8785 cannot write (a lone surrogate) are digested escaped.
    args_sha256: deep ? null : hash('sha256', canonicalize(unsafe ? escapeDeep(args) : args) ?? '', 'hex'),
    ...(unsafe ? { unsafe } : {}),
  };
}

/** Whether arguments are the transport's stand-in, or nest deeper than the limit (one walk, no recursion). */
function tooDeep(args: unknown): boolean {
  const standIn =
    typeof args === 'object' && args !== null && STAND_IN_KEY in args && Object.keys(args).length === 1;
  return standIn || nestedDeeperThan(args, MAX_ARGUMENT_DEPTH);
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

/**
 * The call with its hold wrapped so that a commit the transport awaits fails as the call would have:
 * with the protocol error to answer (heldFailure), judged by what the call had settled as by then.
 */
function holdingFailures(deps: CallDeps, call: Call, settled: () => Settled | undefined): Call {
  const hold = call.hold;
  if (!hold) return call;
  return {
    ...call,
    hold: {
      until: (committed) =>
        hold.until(
          committed.catch(async (err: unknown) => {
            throw await heldFailure(deps, call, err, settled());
          }),
        ),
    },
  };
}

// ---- 2. rate -----------------------------------------------------------------------------------

/** Counts the call against the agent's per-minute limit; over it, the RATE_LIMITED failure with when to retry. */
async function takeRate(deps: CallDeps, call: Call): Promise<AppError | undefined> {
  const wait = await traced(deps.tracer, 'rate_limit.take', {}, () =>
    deps.limiter.take(call.agent.id, call.agent.rate_limit_per_min ?? deps.config.policy.rate_limit_per_min),
  );
  if (wait <= 0) return undefined;
  // Answered at the agent's pace: one that calls on as fast as it is answered is slowed to it.
  await deps.rateLimitedPace?.wait(call.agent.id);
  return new AppError('RATE_LIMITED', `too many calls: retry in ${wait} s`, 'rate_limited', {
    details: { retry_after_s: wait },
  });
}

// ---- 3. lookup ---------------------------------------------------------------------------------

/** How much of an unknown tool's name is stored and echoed; the rest is known by its SHA-256. */
export const MAX_UNKNOWN_TOOL_NAME = 200;

/** The one metrics label every unknown tool name is counted under, so no caller can grow /metrics. */
export const UNKNOWN_TOOL_LABEL = '(unknown)';

/**
 * The tool name as rows, answers and logs carry it: an unknown name cut to MAX_UNKNOWN_TOOL_NAME (never
 * inside a surrogate pair), escaped when it holds what cannot be stored (a NUL, a lone surrogate).
 */
const toolNameOf = (call: Call) => {
  if (!call.unknown) return call.name;
  const cut = cutText(call.name, MAX_UNKNOWN_TOOL_NAME);
  return unsafeText(cut) ? escapeText(cut) : cut;
};

/** Whether the name a call's rows carry (toolNameOf) is an escape of the name as sent. */
const toolNameEscaped = (call: Call) =>
  call.unknown === true && unsafeText(cutText(call.name, MAX_UNKNOWN_TOOL_NAME)) !== undefined;

/** The digest of an unknown tool's whole name (of its escape, when it holds what UTF-8 cannot encode). */
const toolDigestOf = (call: Call) =>
  hash('sha256', unsafeText(call.name) ? escapeText(call.name) : call.name, 'hex');

/** The tool label a call is counted under in /metrics. */
const metricLabelOf = (call: Call) => (call.unknown ? UNKNOWN_TOOL_LABEL : call.name);

/**
 * A name that is neither a tool nor an upstream's: -32602, audited (the name cut, with its digest). The
 * message suggests the closest tool this agent may call, if one is close.
 */
async function refuseUnknownTool(deps: CallDeps, call: Call, catalogue: Catalogue): Promise<never> {
  const names = catalogue.listFor(deps.profiles.get(call.agent.profile)).map((t) => t.name);
  const near = closestName(call.name, names);
  const message =
    `Unknown tool: ${toolNameOf(call)}` +
    (near ? `; did you mean ${near}?` : '; tools/list shows the tools this agent may call');
  throw await protocolError(deps, call, 'unknown_tool', message, near ? { did_you_mean: near } : {});
}

// ---- 4. admit ----------------------------------------------------------------------------------

/** The agent's profile must allow the tool's facet; a denial is a protocol error with the profile's reason. */
async function admit(deps: CallDeps, call: Call, tool: AnyToolDef): Promise<Profile> {
  const profile = deps.profiles.get(call.agent.profile);
  if (profile?.allowed.has(tool.facet)) return profile;
  const reason = profile
    ? (profile.deny[tool.facet] ?? `the ${tool.facet} facet is not allowed`)
    : `this agent's profile "${call.agent.profile}" is not installed on this server`;
  await appendCallRow(deps, call, {
    kind: 'auth.denied',
    details: { facet: tool.facet, profile: call.agent.profile, reason },
    result: 'error',
    error_code: ANSWERS.tool_denied.audit,
  });
  deps.metrics.denied();
  // The specification's -32002 is sent as -32602, as SDK v2 would send it; data.code TOOL_DENIED tells it
  // apart (docs/adr/0001-denied-tool-error-code.md).
  throw wireError('tool_denied', `Tool ${call.name} is not available to this agent: ${reason}`, {
    reason,
    trace_id: call.trace_id,
  });
}

// ---- 5. validate -------------------------------------------------------------------------------

/** The arguments as the tool's input schema reads them, or INVALID_ARGUMENT naming the first problem. */
function validate(tool: AnyToolDef, call: Call): Record<string, unknown> {
  if (call.args_sha256 === null) {
    throw new AppError(
      'INVALID_ARGUMENT',
      `arguments: nested deeper than ${MAX_ARGUMENT_DEPTH} levels`,
      'too_deep',
    );
  }
  if (call.unsafe) {
    const { problem } = call.unsafe;
    const what = problem === 'nul_byte' ? 'a NUL byte' : 'a lone UTF-16 surrogate';
    throw new AppError('INVALID_ARGUMENT', `${fieldOf(call.unsafe)}: contains ${what}`, problem, {
      details: { field: fieldOf(call.unsafe), problem, at: call.unsafe.at },
    });
  }
  const parsed = tool.input.safeParse(call.args);
  if (!parsed.success) {
    throw new AppError('INVALID_ARGUMENT', describeIssue(parsed.error.issues[0]!), 'invalid_argument', {
      details: { issues: parsed.error.issues.map(describeIssue) },
    });
  }
  return parsed.data as Record<string, unknown>;
}

function describeIssue(issue: z.core.$ZodIssue): string {
  const where = issue.path.length > 0 ? issue.path.join('.') : 'arguments';
  return `${where}: ${issue.message}`;
}

/** The argument's name as answers and rows give it: its path under the arguments, keys escaped. */
const fieldOf = (unsafe: UnsafeInput) => unsafe.field.replace(/^arguments\.?/, '') || 'arguments';

/** Of an escaped value, the row keeps at most this many characters (and the whole escape's digest). */
const MAX_ESCAPED = 1024;

/** What a call's rows record of an argument that could not be stored: the escape of it (docs/audit.md). */
function invalidArgument(unsafe: UnsafeInput) {
  const escaped = escapeText(unsafe.text);
  const kept = escaped.length <= MAX_ESCAPED ? escaped : escapeText(cutText(unsafe.text, MAX_ESCAPED / 8));
  return {
    field: fieldOf(unsafe),
    problem: unsafe.problem,
    at: unsafe.at,
    value_escaped: kept,
    ...(kept === escaped ? {} : { value_truncated: true, value_sha256: hash('sha256', escaped, 'hex') }),
  };
}

// ---- 6. handle ---------------------------------------------------------------------------------

/**
 * The tool's own work under the call deadline, with the context its kind may reach: a read tool cannot
 * reach approval decisions, a memory tool only the agent's notes, and a write goes through the gate.
 * A result that arrives after the deadline is thrown away, and counted.
 */
function handle(
  deps: CallDeps,
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
        facet: tool.facet,
        approvals: deps.approvals,
        faults: deps.faults,
        progress: call.progress,
        ...(call.tasks?.asTask ? { asTask: { tool: call.name } } : {}),
        ...(call.tasks?.task_id ? { task_id: call.tasks.task_id } : {}),
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

/** A failure the envelope cannot carry: it crosses the wire as a JSON-RPC error (core/answers.ts). */
interface WireFailure {
  wire: 'call_timeout' | 'crash';
  err: unknown;
}

/**
 * What a thrown error is: a tool failure, answered in the envelope (an AppError; the database gone under
 * the handler is one, said as such and audited if it is back in time), or a failure that crosses the
 * wire — a call over its deadline, or a crash.
 */
function failureOf(err: unknown): AppError | WireFailure {
  if (isOverrun(err)) return { wire: 'call_timeout', err };
  const outage = outageOf(err);
  if (outage) return outage;
  return err instanceof AppError ? err : { wire: 'crash', err };
}

/**
 * The protocol error a failure that crosses the wire is thrown as, audited and counted: -32001 past the
 * deadline; -32603 with a trace id and no stack for a crash, which is logged.
 */
function wireFailure(deps: CallDeps, call: Call, { wire, err }: WireFailure) {
  if (wire === 'call_timeout') {
    deps.metrics.overrun();
    // A write past write.started stays `executing` until reconciliation settles it: never "not sent".
    const message = `Call exceeded its deadline of ${deps.config.limits.call_timeout_ms} ms`;
    return protocolError(deps, call, 'call_timeout', message);
  }
  deps.log.error(
    { err, trace_id: call.trace_id, tool: call.name, agent: call.agent.name },
    'tool handler crashed',
  );
  return protocolError(deps, call, 'crash', internalMessage(call.trace_id));
}

// ---- 7. record ---------------------------------------------------------------------------------

/** A call's result built for the seq its row was chained with. */
interface Built {
  seq: number;
  result: CallToolResult;
}

/**
 * Appends the call's audit row, counts it, and wraps the outcome in the envelope (audit_seq included).
 * The envelope is built while the row commits, from the row as chained (rebuilt if it was chained
 * anew). With a hold, the result is returned before the commit, which the hold then carries: the
 * transport sends the answer only once the row is committed (AnswerHold).
 */
async function record(deps: CallDeps, call: Call, settled: Settled): Promise<CallToolResult> {
  const facts = settled.outcome?.audit ?? {};
  const failure = settled.failure;
  const task = settled.outcome?.task;
  const answer = (audit_seq: number) =>
    task
      ? taskCreated(task)
      : toCallResult(
          {
            tool: toolNameOf(call),
            request_id: call.request_id,
            trace_id: call.trace_id,
            operator_id: call.agent.id,
            started: call.started,
            audit_seq,
          },
          settled,
          now(deps),
        );
  /** The result built from the row as chained, while it commits. */
  let early: Built | undefined;
  let built = (_: Built) => {};
  const announced = new Promise<Built>((resolve) => (built = resolve));
  if (deps.faults) await deps.faults.at('before_call_row');
  const committed = appendCallRow(
    deps,
    call,
    {
      details: {
        duration_ms: elapsedMs(deps, call),
        ...(failure ? { reason: failure.reason ?? null } : {}),
        ...facts.details,
      },
      ...factColumns(facts),
      result: failure ? 'error' : 'ok',
      error_code: failure ? toolCodeOf(failure) : null,
    },
    (row) => built((early = { seq: row.seq, result: answer(row.seq) })),
  ).then((row) => {
    // Timed at the commit, counted once the answer is on its way: no part of the call's path.
    const took = seconds(deps, call);
    setImmediate(() => deps.metrics.record(metricLabelOf(call), failure ? toolCodeOf(failure) : null, took));
    return row;
  });
  // A task's answer does not depend on the row's seq: it goes once the row has committed.
  if (call.hold && !task) {
    // Announced before committed: the result goes now, the commit to the hold.
    const sent = await Promise.race([announced, committed.then(() => undefined)]);
    if (sent) {
      call.hold.until(committed.then((row) => (row.seq === sent.seq ? undefined : answer(row.seq))));
      return sent.result;
    }
  }
  const row = await committed;
  return early?.seq === row.seq ? early.result : answer(row.seq);
}

/**
 * A write asked for as a task: the CreateTaskResult (Tasks extension) in place of the envelope. The
 * SDK's tools/call result check adds `content: []` to a result without content; it is given here, so
 * that what the check passes is what this says.
 */
const taskCreated = (task: TaskView): CallToolResult =>
  ({
    resultType: 'task',
    taskId: task.taskId,
    status: task.status,
    statusMessage: task.statusMessage,
    createdAt: task.createdAt,
    lastUpdatedAt: task.lastUpdatedAt,
    ttlMs: task.ttlMs,
    pollIntervalMs: task.pollIntervalMs,
    content: [],
  }) as CallToolResult;

type AppendInput = Parameters<AuditLog['append']>[0];

/**
 * The one place a call's rows are appended (the call row, a denial, a protocol error's row): with the
 * fields every row of a call carries, the agent's name among the details, and the arguments' digest;
 * in an `audit.append` span when tracing is on.
 */
function appendCallRow(
  deps: CallDeps,
  call: Call,
  row: Omit<AppendInput, 'kind'> & { kind?: AppendInput['kind'] },
  onChained?: Parameters<AuditLog['append']>[1],
) {
  const kind = row.kind ?? 'tool.call';
  const input: AppendInput = {
    ...row,
    kind,
    request_id: call.request_id,
    trace_id: call.trace_id,
    agent_id: call.agent.id,
    tool: toolNameOf(call),
    details: {
      ...(kind === 'tool.call' ? { args_sha256: call.args_sha256 } : {}),
      ...(call.tasks?.task_id ? { origin: 'task', task_id: call.tasks.task_id } : {}),
      ...row.details,
      ...(call.unknown ? { tool_sha256: toolDigestOf(call) } : {}),
      ...(toolNameEscaped(call) ? { tool_escaped: true } : {}),
      ...(call.unsafe ? { invalid_argument: invalidArgument(call.unsafe) } : {}),
      agent_name: call.agent.name,
    },
  };
  return traced(deps.tracer, 'audit.append', { 'countersign.audit.kind': kind }, () =>
    deps.audit.append(input, onChained),
  );
}

/** The time on the seam's clock (CallDeps.clock). */
const now = (deps: CallDeps) => (deps.clock ?? systemClock).now();
const elapsedMs = (deps: CallDeps, call: Call) => now(deps).getTime() - call.started.getTime();
const seconds = (deps: CallDeps, call: Call) => elapsedMs(deps, call) / 1000;

// ---- Protocol errors and outages ---------------------------------------------------------------

export { DATABASE_UNAVAILABLE } from './answer.ts';

/** A crash's message: the trace id, and no stack trace (README, "The response envelope"). */
const internalMessage = (trace_id: string) => `Internal error (trace_id ${trace_id})`;

/** A crash's protocol error, unaudited: for when its row cannot be written either. */
const internalError = (trace_id: string) => wireError('crash', internalMessage(trace_id), { trace_id });

/** A named failure answered as a JSON-RPC error (core/answers.ts), after its audit row is written and it is counted. */
async function protocolError(
  deps: CallDeps,
  call: Call,
  failure: Refusal,
  message: string,
  data: Record<string, unknown> = {},
) {
  const { audit, counted } = ANSWERS[failure];
  await appendCallRow(deps, call, { result: 'error', error_code: audit });
  deps.metrics.record(metricLabelOf(call), counted, seconds(deps, call));
  return wireError(failure, message, { ...data, trace_id: call.trace_id });
}

/**
 * An error that escaped the steps (a database error while auditing or admitting, a bug): -32603 with
 * data.code INTERNAL and the trace id, logged and audited — never the error's own text. Protocol errors
 * and outages pass through as they are (`outage` answers the latter).
 */
async function crashed(deps: CallDeps, call: Call, err: unknown): Promise<unknown> {
  if (err instanceof ProtocolError || outageOf(err)) return err;
  deps.log.error(
    { err, trace_id: call.trace_id, tool: toolNameOf(call), agent: call.agent.name },
    'call failed',
  );
  try {
    return await protocolError(deps, call, 'crash', internalMessage(call.trace_id));
  } catch (again) {
    if (outageOf(again)) return again;
    return internalError(call.trace_id);
  }
}

/**
 * An outage (a row the database could not take) is answered -32003, and counted, by how far the call's
 * write got as committed (server/answer.ts): SOURCE_UNAVAILABLE when nothing started (nothing was
 * done), OUTCOME_UNKNOWN once write.started committed, OUTCOME_RECORDED once its outcome did. Anything
 * else stays as is.
 */
function outage(deps: CallDeps, call: Call, err: unknown, settled?: Settled): unknown {
  if (!outageOf(err)) return err;
  deps.metrics.record(metricLabelOf(call), stageCode(stageOf(call.progress)), 0);
  const getApproval = `${deps.config.tools.prefix}get_approval`;
  return outageAnswer(call.progress, call.trace_id, getApproval, settled?.failure);
}

/**
 * A held commit's failure as the protocol error the transport answers with: an outage as -32003, and
 * anything else (a database error, a bug) as -32603 with the trace id, logged and audited (crashed) —
 * the transport answers it without the SDK.
 */
async function heldFailure(
  deps: CallDeps,
  call: Call,
  err: unknown,
  settled?: Settled,
): Promise<ProtocolError> {
  const failure = outage(deps, call, await crashed(deps, call, err), settled);
  if (failure instanceof ProtocolError) return failure;
  return internalError(call.trace_id);
}
