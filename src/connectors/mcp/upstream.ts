import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { getDefaultEnvironment, StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import {
  Client,
  StreamableHTTPClientTransport,
  ProtocolError,
  ProtocolErrorCode,
  SdkError,
  SdkErrorCode,
} from '@modelcontextprotocol/client';
import type { Transport, CallToolResult, JsonSchemaType, Tool } from '@modelcontextprotocol/client';
import type { UpstreamConfig } from '../../config.ts';
import type { Logger } from '../../log.ts';
import { AppError } from '../../core/errors.ts';
import { cappedFetch, RESULT_TOO_LARGE } from '../../core/fetch.ts';
import { upstreamValidator } from './schemas.ts';
import { classOf, hintsOf, type Listed, type Pin, type UpstreamPins } from './pins.ts';

export type UpstreamState = 'connecting' | 'up' | 'down' | 'closed';

/** One tool as the upstream lists it, with the hash of its input schema (bound into approvals). */
export interface UpstreamTool {
  tool: Tool;
  input_schema_sha256: string;
  /** Its pinned class (what decides the gate unless the config maps the tool) and any change held back. */
  pin: Pin;
  /** Checks a result's structured content against the tool's output schema, when it declares one. */
  output?: OutputCheck;
}

/** A compiled output schema: whether a value matches it, and if not, why. */
type Validate = (value: unknown) => { valid: boolean; errorMessage?: string };

/** A compiled output schema, or why it would not compile. */
type OutputCheck = { ok: true; validate: Validate } | { ok: false; error: string };

export interface UpstreamStatus {
  name: string;
  state: UpstreamState;
  tools: number;
  /** Tools listed as less gated than their pin, held until an operator accepts the change. */
  held: number;
  last_error: string | null;
  connected_at: string | null;
}

/** A connection to one upstream MCP server that keeps itself up: reconnects with backoff, follows list changes. */
export interface Upstream {
  readonly name: string;
  /** `mcp:<name>`, reported as `source`. */
  readonly source: string;
  status(): UpstreamStatus;
  /** The tools of the last successful listing (kept while the upstream is down). */
  tools(): ReadonlyMap<string, UpstreamTool>;
  /** Resolves when the first connection attempt has settled, whatever its outcome. */
  readonly firstAttempt: Promise<void>;
  /** Called after every listing that changed the tools (including the first). */
  onToolsChanged(listener: () => void): void;
  /** The SOURCE_UNAVAILABLE its tools answer while it is not connected. */
  unavailable(): AppError;
  /** Throws SOURCE_UNAVAILABLE unless the upstream is connected. */
  assertUp(): void;
  /** Lists the tools again (another replica heard that they changed); a failure is logged, not thrown. */
  refresh(): Promise<void>;
  /** Calls a tool; upstream failures come back as AppError (SOURCE_UNAVAILABLE, TIMEOUT, CONNECTOR_FAILED). */
  call(tool: string, args: Record<string, unknown>, signal: AbortSignal): Promise<CallToolResult>;
  /** The stdio child's process id, when there is one running. */
  pid(): number | undefined;
  close(): Promise<void>;
}

const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 30_000;
/** How much of an upstream's error text is kept in the envelope and the audit row. */
const MAX_ERROR_TEXT = 2000;

export const schemaSha256 = (schema: unknown) =>
  createHash('sha256')
    .update(canonicalize(schema ?? {}) ?? '')
    .digest('hex');

/** The text an upstream put into an `isError` result, trimmed to a readable size. */
export function errorText(result: CallToolResult): string {
  const text = result.content
    .map((c) => (c.type === 'text' ? c.text : `[${c.type}]`))
    .join('\n')
    .trim();
  return (text || 'the upstream reported an error without text').slice(0, MAX_ERROR_TEXT);
}

function transportFor(cfg: UpstreamConfig): Transport {
  if (cfg.command) {
    return new StdioClientTransport({
      command: cfg.command,
      args: cfg.args ?? [],
      env: { ...getDefaultEnvironment(), ...cfg.env },
      ...(cfg.cwd ? { cwd: cfg.cwd } : {}),
      stderr: 'pipe',
      // One message (one line) may be as long as the cap; past it the SDK drops the connection.
      maxBufferSize: cfg.max_result_bytes,
    });
  }
  return new StreamableHTTPClientTransport(new URL(cfg.url!), {
    requestInit: { headers: cfg.headers ?? {} },
    fetch: cappedFetch(cfg.max_result_bytes),
  });
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null;

const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err)).slice(0, 500);

/** The changing side of one upstream connection; the functions below move it from state to state. */
interface Link {
  readonly cfg: UpstreamConfig;
  readonly log: Logger;
  readonly timeoutMs: number;
  readonly clientVersion: string;
  readonly pins: UpstreamPins;
  state: UpstreamState;
  client: Client | undefined;
  transport: Transport | undefined;
  tools: Map<string, UpstreamTool>;
  lastError: string | null;
  connectedAt: string | null;
  attempt: number;
  retryTimer: NodeJS.Timeout | undefined;
  /** The stdio connection was dropped because a message passed max_result_bytes. */
  tooLarge: boolean;
  readonly listeners: (() => void)[];
}

// A function, not a comparison, because state changes while a connection attempt awaits.
const closed = (link: Link) => link.state === 'closed';

function setDown(link: Link, reason: string) {
  if (link.state === 'closed') return;
  const wasUp = link.state === 'up';
  link.state = 'down';
  link.lastError = reason;
  if (wasUp) link.log.warn({ reason }, 'upstream disconnected; reconnecting');
  scheduleReconnect(link);
}

function scheduleReconnect(link: Link) {
  if (link.state === 'closed' || link.retryTimer) return;
  const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** Math.min(link.attempt, 16));
  link.attempt++;
  link.retryTimer = setTimeout(
    () => {
      link.retryTimer = undefined;
      void connect(link);
    },
    delay * (0.75 + Math.random() * 0.5),
  );
  link.retryTimer.unref();
}

/** The tool's output schema compiled once, when it is listed (undefined: it declares none). */
function outputCheck(tool: Tool): OutputCheck | undefined {
  if (!tool.outputSchema) return undefined;
  try {
    return { ok: true, validate: upstreamValidator(tool.outputSchema as JsonSchemaType) };
  } catch (err) {
    return { ok: false, error: messageOf(err).slice(0, 200) };
  }
}

/** Every page of the upstream's tool list, before the pins are applied. */
async function listAllTools(c: Client, timeoutMs: number): Promise<Map<string, Omit<UpstreamTool, 'pin'>>> {
  const tools = new Map<string, Omit<UpstreamTool, 'pin'>>();
  let cursor: string | undefined;
  do {
    const page = await c.listTools(cursor ? { cursor } : undefined, { timeout: timeoutMs });
    for (const tool of page.tools) {
      const output = outputCheck(tool);
      tools.set(tool.name, {
        tool,
        input_schema_sha256: schemaSha256(tool.inputSchema),
        ...(output ? { output } : {}),
      });
    }
    cursor = page.nextCursor;
  } while (cursor);
  return tools;
}

const fingerprint = (tools: Map<string, UpstreamTool>) =>
  JSON.stringify([...tools.entries()].map(([n, t]) => [n, t.input_schema_sha256, t.tool, t.pin]));

/** The listing with each tool's pin: new tools pinned, changes recorded (a listing is only used pinned). */
async function pinned(link: Link, listed: Map<string, Omit<UpstreamTool, 'pin'>>) {
  const trust = link.cfg.trust_annotations;
  const said = new Map<string, Listed>(
    [...listed].map(([name, t]) => {
      const annotations = hintsOf(t.tool.annotations);
      return [
        name,
        { class: classOf(annotations, trust), annotations, input_schema_sha256: t.input_schema_sha256 },
      ];
    }),
  );
  const pins = await link.pins.classify(link.cfg.name, said);
  return new Map<string, UpstreamTool>(
    [...listed].map(([name, t]) => [name, { ...t, pin: pins.get(name) ?? { class: 'write', held: null } }]),
  );
}

async function refreshTools(link: Link, c: Client) {
  const next = await pinned(link, await listAllTools(c, link.timeoutMs));
  const changed = fingerprint(link.tools) !== fingerprint(next);
  link.tools = next;
  if (changed) {
    link.log.info({ tools: next.size }, 'upstream tools listed');
    for (const listener of link.listeners) listener();
  }
}

/** Lists again after word of a change (the upstream's own, or another replica's); failures are logged. */
const relist = (link: Link, c: Client) =>
  refreshTools(link, c).catch((err: unknown) =>
    link.log.warn({ err: messageOf(err) }, 'relisting upstream tools failed'),
  );

/** A transport for the upstream, with a stdio child's stderr passed on to the debug log. */
function openTransport(link: Link): Transport {
  const t = transportFor(link.cfg);
  if (t instanceof StdioClientTransport) {
    t.stderr?.on('data', (chunk: Buffer) =>
      link.log.debug({ stderr: chunk.toString().trimEnd() }, 'upstream stderr'),
    );
  }
  return t;
}

async function connect(link: Link) {
  if (closed(link)) return;
  const c = new Client({ name: 'countersign', version: link.clientVersion });
  const t = openTransport(link);
  try {
    await c.connect(t, { timeout: link.timeoutMs });
    if (closed(link)) {
      await c.close();
      return;
    }
    c.setNotificationHandler('notifications/tools/list_changed', () => relist(link, c));
    link.tooLarge = false;
    watchSize(link, t);
    await refreshTools(link, c);
    link.client = c;
    link.transport = t;
    link.state = 'up';
    link.attempt = 0;
    link.lastError = null;
    link.connectedAt = new Date().toISOString();
    // Set after the first listing so that a failed start is handled by the catch below, once.
    c.onclose = () => {
      if (link.client === c) {
        link.client = undefined;
        setDown(link, 'connection closed');
      }
    };
    link.log.info({ tools: link.tools.size }, 'upstream connected');
  } catch (err) {
    await c.close().catch(() => undefined);
    link.lastError = messageOf(err);
    if (!closed(link)) {
      link.state = 'down';
      link.log.warn({ err: link.lastError, attempt: link.attempt }, 'upstream connection failed; retrying');
      scheduleReconnect(link);
    }
  }
}

/** Notes a stdio message past the cap (the SDK reports it, then closes): the calls it ends are told why. */
function watchSize(link: Link, t: Transport) {
  if (!(t instanceof StdioClientTransport)) return;
  const reported = t.onerror;
  t.onerror = (err) => {
    if (/ReadBuffer exceeded maximum size/.test(err.message)) link.tooLarge = true;
    reported?.(err);
  };
}

/** CONNECTOR_FAILED for an answer larger than the upstream's max_result_bytes. */
const resultTooLarge = (cfg: UpstreamConfig) =>
  new AppError(
    'CONNECTOR_FAILED',
    `upstream "${cfg.name}" answered more than max_result_bytes (${cfg.max_result_bytes} bytes); the answer was dropped`,
    'result_too_large',
    { details: { max_result_bytes: cfg.max_result_bytes } },
  );

const unavailable = (name: string, why: string | null) =>
  new AppError(
    'SOURCE_UNAVAILABLE',
    `upstream "${name}" is not connected${why ? ` (${why})` : ''}; countersign keeps reconnecting`,
    'upstream_down',
  );

/** Maps what can go wrong in a call to the envelope's codes; a transport failure also takes the upstream down. */
function failure(link: Link, err: unknown, c: Client, signal: AbortSignal): AppError {
  const name = link.cfg.name;
  if (err instanceof AppError) return err;
  // Our own deadline or the agent's cancellation: the upstream itself is fine.
  if (signal.aborted) {
    return new AppError('TIMEOUT', `the call to upstream "${name}" was cancelled`, 'cancelled');
  }
  if (err instanceof SdkError && err.code === SdkErrorCode.RequestTimeout) {
    return new AppError('TIMEOUT', `upstream "${name}" did not answer in time`, 'upstream_timeout');
  }
  if (err instanceof ProtocolError && isRecord(err.data) && RESULT_TOO_LARGE in err.data) {
    return resultTooLarge(link.cfg);
  }
  if (err instanceof SdkError && err.code === SdkErrorCode.ConnectionClosed) {
    const tooLarge = link.tooLarge;
    if (link.client === c) {
      link.client = undefined;
      setDown(link, 'connection closed during a call');
    }
    return tooLarge ? resultTooLarge(link.cfg) : unavailable(name, 'connection closed during the call');
  }
  if (err instanceof ProtocolError) {
    return new AppError(
      'CONNECTOR_FAILED',
      `upstream "${name}" answered with an error: ${err.message}`.slice(0, MAX_ERROR_TEXT),
      'upstream_protocol_error',
      { details: { rpc_code: err.code } },
    );
  }
  // Anything else is the transport failing (an HTTP upstream unreachable, a broken pipe).
  if (link.client === c) {
    link.client = undefined;
    void c.close().catch(() => undefined);
    setDown(link, messageOf(err));
  }
  return unavailable(name, messageOf(err));
}

/**
 * Calls the tool as the SDK client's callTool does, with the output check it makes: a tool that
 * declares an output schema must answer structured content that matches it (unless it reports an
 * error). The check is compiled when the tools are listed; callTool looked it up in the client's
 * response cache on every call, which cost a sequential proxied read about 60–120 µs (A/B, measured).
 */
async function callTool(link: Link, tool: string, args: Record<string, unknown>, signal: AbortSignal) {
  const c = link.client;
  if (!c || link.state !== 'up') throw unavailable(link.cfg.name, link.lastError);
  const output = link.tools.get(tool)?.output;
  try {
    if (output && !output.ok) {
      throw new ProtocolError(
        ProtocolErrorCode.InvalidParams,
        `Tool '${tool}' has an invalid outputSchema: ${output.error}`,
      );
    }
    const result = (await c.request(
      { method: 'tools/call', params: { name: tool, arguments: args } },
      { signal, timeout: link.timeoutMs },
    )) as CallToolResult;
    if (output?.ok && !result.isError) checkStructured(tool, output.validate, result);
    return result;
  } catch (err) {
    throw failure(link, err, c, signal);
  }
}

/** Throws the SDK client's protocol errors for structured content that is missing or does not match. */
export function checkStructured(tool: string, validate: Validate, result: CallToolResult) {
  if (result.structuredContent === undefined) {
    throw new ProtocolError(
      ProtocolErrorCode.InvalidRequest,
      `Tool ${tool} has an output schema but did not return structured content`,
    );
  }
  const checked = validate(result.structuredContent);
  if (!checked.valid) {
    throw new ProtocolError(
      ProtocolErrorCode.InvalidParams,
      `Structured content does not match the tool's output schema: ${checked.errorMessage}`,
    );
  }
}

async function closeLink(link: Link) {
  link.state = 'closed';
  clearTimeout(link.retryTimer);
  const c = link.client;
  link.client = undefined;
  await c?.close().catch(() => undefined);
}

export function connectUpstream(
  cfg: UpstreamConfig,
  opts: { log: Logger; timeoutMs: number; clientVersion: string; pins: UpstreamPins },
): Upstream {
  const link: Link = {
    cfg,
    log: opts.log.child({ upstream: cfg.name }),
    timeoutMs: opts.timeoutMs,
    clientVersion: opts.clientVersion,
    pins: opts.pins,
    state: 'connecting',
    client: undefined,
    transport: undefined,
    tools: new Map(),
    lastError: null,
    connectedAt: null,
    attempt: 0,
    retryTimer: undefined,
    tooLarge: false,
    listeners: [],
  };
  return {
    name: cfg.name,
    source: `mcp:${cfg.name}`,
    firstAttempt: connect(link),
    status: () => ({
      name: cfg.name,
      state: link.state,
      tools: link.tools.size,
      held: [...link.tools.values()].filter((t) => t.pin.held !== null).length,
      last_error: link.lastError,
      connected_at: link.connectedAt,
    }),
    tools: () => link.tools,
    onToolsChanged(listener) {
      link.listeners.push(listener);
    },
    unavailable: () => unavailable(cfg.name, link.lastError),
    assertUp() {
      if (!link.client || link.state !== 'up') throw unavailable(cfg.name, link.lastError);
    },
    async refresh() {
      if (link.client && link.state === 'up') await relist(link, link.client);
    },
    call: (tool, args, signal) => callTool(link, tool, args, signal),
    pid: () =>
      link.transport instanceof StdioClientTransport ? (link.transport.pid ?? undefined) : undefined,
    close: () => closeLink(link),
  };
}
