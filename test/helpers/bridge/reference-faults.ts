import type http from 'node:http';
import { sendJson } from './reference-http.ts';
import { BridgeErrorKind, ERROR_STATUS, type ErrorBody } from '../../../src/connectors/bridge/wire.ts';

/**
 * What the reference bridge can be told to do wrong, for the tests of countersign's client:
 * - delay: hold the request this long (or until release()) before answering normally; a write is
 *   registered as pending first and lands when the delay ends, as a slow messenger's would;
 * - http_500: a plain-text 500; not_json: a 200 that is not JSON; wrong_shape: JSON of the wrong shape;
 * - reset: drop the connection without answering; nothing is performed;
 * - error: the contract's error body with this kind (any string, to test unknown kinds).
 */
export type ReferenceFault =
  | { kind: 'delay'; ms: number }
  | { kind: 'http_500' }
  | { kind: 'not_json' }
  | { kind: 'wrong_shape' }
  | { kind: 'reset' }
  | { kind: 'error'; error: string; status?: number };

export interface FaultRule {
  fault: ReferenceFault;
  /** Only requests whose "METHOD /path" starts with this, e.g. "POST /messages". */
  route?: string;
  /** Only this many requests (default: until changed). */
  times?: number;
}

/** Thrown into a delayed request when the bridge closes meanwhile: it is dropped, not performed. */
export class Aborted extends Error {}

/** The fault rule in force, the delays it holds, and how a fault replaces an answer. */
export function createFaults(initial?: FaultRule) {
  let rule: FaultRule | undefined = initial && { ...initial };
  const delays = new Set<{ end: (proceed: boolean) => void }>();

  /** The fault for this request ("METHOD /path"), counting it against `times`. */
  function take(route: string): ReferenceFault | undefined {
    if (!rule || (rule.route && !route.startsWith(rule.route))) return undefined;
    const fault = rule.fault;
    if (rule.times !== undefined && --rule.times <= 0) rule = undefined;
    return fault;
  }

  /** Waits out a delay fault; throws Aborted when the bridge closes meanwhile. */
  function pause(fault: ReferenceFault | undefined): Promise<void> {
    if (fault?.kind !== 'delay') return Promise.resolve();
    return new Promise((resolve, reject) => {
      const entry = {
        end: (proceed: boolean) => {
          clearTimeout(timer);
          delays.delete(entry);
          if (proceed) resolve();
          else reject(new Aborted());
        },
      };
      const timer = setTimeout(() => entry.end(true), fault.ms);
      delays.add(entry);
    });
  }

  /** Applies a fault that replaces the answer; false when the request should be handled normally. */
  function preempt(
    fault: ReferenceFault | undefined,
    req: http.IncomingMessage,
    res: http.ServerResponse,
  ): boolean {
    switch (fault?.kind) {
      case undefined:
      case 'delay':
        return false;
      case 'reset':
        req.socket.destroy();
        return true;
      case 'http_500':
        res.writeHead(500, { 'content-type': 'text/plain' }).end('Internal Server Error');
        return true;
      case 'not_json':
        res.writeHead(200, { 'content-type': 'text/html' }).end('<html><body>Login</body></html>');
        return true;
      case 'wrong_shape':
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"items":"none","next_cursor":7}');
        return true;
      case 'error': {
        const known = BridgeErrorKind.safeParse(fault.error);
        const status = fault.status ?? (known.success ? ERROR_STATUS[known.data] : 500);
        sendJson(res, status, {
          error: { kind: fault.error, message: 'injected fault' },
        } satisfies ErrorBody);
        return true;
      }
    }
  }

  return {
    set(fault: ReferenceFault | null, options: Omit<FaultRule, 'fault'> = {}) {
      rule = fault ? { fault, ...options } : undefined;
    },
    take,
    pause,
    preempt,
    /** Ends every delay: the held requests proceed, or (closing) are dropped. */
    endDelays(proceed: boolean) {
      for (const d of [...delays]) d.end(proceed);
    },
  };
}
