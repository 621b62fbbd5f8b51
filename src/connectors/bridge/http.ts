import type { z } from 'zod';
import type { Logger } from '../../log.ts';
import { AppError } from '../../core/errors.ts';
import { BridgeErrorKind, ERROR_CODE, ErrorBody } from './wire.ts';

export interface BridgeConfig {
  url: string;
  timeout_ms: number;
  headers: Readonly<Record<string, string>>;
}

export interface BridgeRequest {
  method?: 'GET' | 'POST';
  /** Relative to the bridge URL, without a leading slash. */
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  /** Sent as Idempotency-Key (writes). */
  key?: string;
}

const MAX_ERROR_TEXT = 500;

/** How a request is named in messages and logs: method and first path segment, never ids or query. */
const describe = (req: BridgeRequest) => `${req.method ?? 'GET'} /${req.path.split('/')[0]}`;

/** Failures before or while reading an answer: our deadline, or the bridge out of reach. */
function transportError(err: unknown, what: string, timeoutMs: number): AppError {
  if (err instanceof AppError) return err;
  // fetch and AbortSignal.timeout report the deadline as a DOMException, told apart only by its name.
  const name = (err as { name?: string } | null)?.name;
  if (name === 'TimeoutError' || name === 'AbortError') {
    return new AppError(
      'TIMEOUT',
      `the bridge did not answer ${what} within ${timeoutMs} ms`,
      'bridge_timeout',
      { cause: err },
    );
  }
  // fetch reports refused/reset connections and DNS failures as a TypeError with the cause inside.
  if (err instanceof TypeError) {
    const code = (err.cause as { code?: string } | undefined)?.code ?? null;
    return new AppError('SOURCE_UNAVAILABLE', `the bridge is unreachable (${what})`, 'bridge_unreachable', {
      cause: err,
      details: { network_error: code },
    });
  }
  return new AppError('CONNECTOR_FAILED', `the bridge request ${what} failed`, 'bridge_request_failed', {
    cause: err,
  });
}

/** A non-2xx answer: a known error kind becomes its code; anything else is the bridge failing. */
async function errorFrom(res: Response, what: string): Promise<AppError> {
  const text = await res.text().catch(() => '');
  let parsed: ReturnType<typeof ErrorBody.safeParse> | undefined;
  try {
    parsed = ErrorBody.safeParse(JSON.parse(text));
  } catch {
    parsed = undefined;
  }
  const error = parsed?.success ? parsed.data.error : undefined;
  const kind = error ? BridgeErrorKind.safeParse(error.kind) : undefined;
  if (error && kind?.success) {
    return new AppError(
      ERROR_CODE[kind.data],
      `bridge: ${error.message || kind.data}`.slice(0, MAX_ERROR_TEXT),
      `bridge_${kind.data.toLowerCase()}`,
      error.candidates ? { details: { candidates: error.candidates } } : undefined,
    );
  }
  return new AppError(
    'CONNECTOR_FAILED',
    `the bridge answered ${what} with HTTP ${res.status}`,
    `bridge_http_${res.status}`,
    { details: { bridge_kind: error?.kind ?? null } },
  );
}

/** What every request to one bridge shares. */
interface Endpoint {
  /** The bridge URL with a trailing slash. */
  base: string;
  config: BridgeConfig;
  log: Logger | undefined;
}

/** Sends a request and returns its 2xx answer unread; every failure comes out as an AppError. */
async function send(to: Endpoint, req: BridgeRequest, accept: string): Promise<Response> {
  const url = new URL(req.path, to.base);
  for (const [k, v] of Object.entries(req.query ?? {})) {
    if (v !== undefined) url.searchParams.set(k, String(v));
  }
  const what = describe(req);
  const headers: Record<string, string> = { ...to.config.headers, accept };
  if (req.body !== undefined) headers['content-type'] = 'application/json';
  if (req.key !== undefined) headers['idempotency-key'] = req.key;
  let res: Response;
  try {
    res = await fetch(url, {
      method: req.method ?? 'GET',
      headers,
      body: req.body === undefined ? undefined : JSON.stringify(req.body),
      signal: AbortSignal.timeout(to.config.timeout_ms),
    });
  } catch (err) {
    const failure = transportError(err, what, to.config.timeout_ms);
    to.log?.warn({ err: failure.reason, request: what }, 'bridge request failed');
    throw failure;
  }
  if (!res.ok) {
    const failure = await errorFrom(res, what).catch((err: unknown) =>
      transportError(err, what, to.config.timeout_ms),
    );
    to.log?.debug({ status: res.status, reason: failure.reason, request: what }, 'bridge answered an error');
    throw failure;
  }
  return res;
}

/** A JSON request whose 2xx answer must match `schema`. */
async function sendJson<S extends z.ZodType>(
  to: Endpoint,
  req: BridgeRequest,
  schema: S,
): Promise<z.infer<S>> {
  const res = await send(to, req, 'application/json');
  const what = describe(req);
  let text: string;
  try {
    text = await res.text();
  } catch (err) {
    throw transportError(err, what, to.config.timeout_ms);
  }
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw malformed(what, 'not JSON');
  }
  const parsed = schema.safeParse(body);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw malformed(what, `${issue?.path.join('.') || '(root)'}: ${issue?.message ?? 'invalid'}`);
  }
  return parsed.data;
}

/** The one place that speaks HTTP to the bridge and turns every way it can fail into a AppError. */
export function createBridgeHttp(config: BridgeConfig, log?: Logger) {
  // A base without a trailing slash would make relative paths replace its last segment.
  const to: Endpoint = { base: config.url.endsWith('/') ? config.url : `${config.url}/`, config, log };
  return {
    /** A JSON request whose 2xx answer must match `schema`. */
    json: <S extends z.ZodType>(req: BridgeRequest, schema: S): Promise<z.infer<S>> =>
      sendJson(to, req, schema),
    /** A request whose 2xx answer is bytes, returned unread. */
    bytes: (req: BridgeRequest) => send(to, req, 'application/octet-stream'),
    transportError: (err: unknown, what: string): AppError => transportError(err, what, config.timeout_ms),
  };
}

export type BridgeHttp = ReturnType<typeof createBridgeHttp>;

export const malformed = (what: string, problem: string) =>
  new AppError(
    'CONNECTOR_FAILED',
    `the bridge's answer to ${what} does not match the contract`,
    'malformed_answer',
    { details: { problem: problem.slice(0, MAX_ERROR_TEXT) } },
  );
