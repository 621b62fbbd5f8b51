import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import { BridgeFailure, defaultSeed, type ReferenceSeed } from './reference-data.ts';
import { createReferenceStore, type SentWrite } from './reference-store.ts';
import { Aborted, createFaults, type FaultRule, type ReferenceFault } from './reference-faults.ts';
import { decodeCursor, encodeCursor, parse, readJson, sendJson } from './reference-http.ts';
import {
  ERROR_STATUS,
  SendFileBody,
  SendMessageBody,
  type ErrorBody,
} from '../../../src/connectors/bridge/wire.ts';

export type { FaultRule, ReferenceFault, ReferenceSeed, SentWrite };

export interface ReferenceBridge {
  url: string;
  /** Every write the messenger really performed, in order. */
  sent: readonly SentWrite[];
  setFault(fault: ReferenceFault | null, options?: Omit<FaultRule, 'fault'>): void;
  /** Ends every current delay now; the delayed requests then complete. */
  release(): void;
  /** Resolves once no request is being handled. */
  idle(): Promise<void>;
  /** Stops listening and drops open connections, so requests are refused; acceptConnections() undoes it. */
  refuseConnections(): Promise<void>;
  acceptConnections(): Promise<void>;
  close(): Promise<void>;
}

interface WriteState {
  digest: string;
  done: Promise<SentWrite>;
  result?: SentWrite;
}

const Limit = z.coerce.number().int().min(1).max(200).default(50);
const Flag = z
  .enum(['true', 'false'])
  .default('false')
  .transform((v) => v === 'true');

/** An in-memory messenger behind the bridge contract of docs/bridge.md, on node:http. */
export async function startReferenceBridge(
  options: { seed?: ReferenceSeed; fault?: FaultRule; host?: string } = {},
): Promise<ReferenceBridge> {
  const store = createReferenceStore(options.seed ?? defaultSeed());
  const writes = new Map<string, WriteState>();
  const inflight = new Set<Promise<void>>();
  const faults = createFaults(options.fault);
  let closed = false;

  /** Performs a write once per key: a repeat gets the first result (waiting for it if still in flight). */
  async function once(
    key: string,
    body: unknown,
    fault: ReferenceFault | undefined,
    perform: () => SentWrite,
  ) {
    const digest = JSON.stringify(body);
    const prior = writes.get(key);
    if (prior) {
      if (prior.digest !== digest) {
        throw new BridgeFailure('IDEMPOTENCY_CONFLICT', 'this Idempotency-Key was used for another write');
      }
      return prior.done;
    }
    const state: WriteState = { digest, done: faults.pause(fault).then(perform) };
    writes.set(key, state);
    // A write that failed (bad target, closed bridge) did not happen: its key is free again.
    void state.done.then(
      (r) => (state.result = r),
      () => writes.delete(key),
    );
    return state.done;
  }

  async function route(
    method: string,
    path: string,
    q: URLSearchParams,
    req: http.IncomingMessage,
    fault: ReferenceFault | undefined,
  ) {
    const parts = path.split('/').slice(1).map(decodeURIComponent);
    const param = (name: string) => q.get(name) || undefined;
    const paged = <T>(items: T[]) => {
      const limit = parse(Limit, q.get('limit') ?? undefined, 'limit');
      const offset = q.get('cursor') ? decodeCursor(q.get('cursor')!) : 0;
      const next = offset + limit < items.length ? encodeCursor(offset + limit) : null;
      return { items: items.slice(offset, offset + limit), next_cursor: next };
    };
    const isWrite = method === 'POST';
    if (!isWrite) await faults.pause(fault);

    if (method === 'GET' && parts[0] === 'contacts' && parts.length === 1) {
      return paged(
        store.searchContacts(
          q.get('query') ?? '',
          parse(Flag, param('include_inactive'), 'include_inactive'),
        ),
      );
    }
    if (method === 'GET' && parts[0] === 'groups' && parts.length === 1) {
      return paged(
        store.searchGroups(q.get('query') ?? '', parse(Flag, param('include_archived'), 'include_archived')),
      );
    }
    if (method === 'GET' && parts[0] === 'conversations') {
      if (parts.length === 2) return { conversation: store.conversation(parts[1]!) };
      return { items: store.conversationsByName(q.get('name') ?? '', param('conversation_type')) };
    }
    if (method === 'GET' && parts[0] === 'messages') {
      return paged(
        store.messages({
          conversation_id: param('conversation_id'),
          conversation_type: param('conversation_type'),
          keyword: param('keyword'),
          since: param('since'),
          attachments: parse(Flag, param('include_attachments'), 'include_attachments'),
        }),
      );
    }
    if (method === 'GET' && parts[0] === 'files') {
      if (parts.length === 3 && parts[2] === 'content') return store.fileBytes(parts[1]!);
      return paged(
        store.files({
          conversation_id: param('conversation_id'),
          message_id: param('message_id'),
          file_id: param('file_id'),
        }),
      );
    }
    if (method === 'GET' && path === '/targets/resolve') {
      const type = parse(z.enum(['contact', 'group', 'conversation']), param('target_type'), 'target_type');
      return { target: store.resolve(type, q.get('ref') ?? '') };
    }
    if (method === 'GET' && parts[0] === 'writes' && parts.length === 2) {
      const state = writes.get(parts[1]!);
      if (!state) return { status: 'not_found' };
      return state.result
        ? { status: 'found', ref: state.result.ref, file_ref: state.result.file_ref }
        : { status: 'pending' };
    }
    if (isWrite && (path === '/messages' || path === '/files')) {
      const key = req.headers['idempotency-key'];
      if (typeof key !== 'string' || key === '') {
        throw new BridgeFailure('INVALID_ARGUMENT', 'writes need an Idempotency-Key header');
      }
      const raw = await readJson(req);
      let write: SentWrite;
      if (path === '/messages') {
        const body = parse(SendMessageBody, raw, 'body');
        write = await once(key, body, fault, () => store.sendMessage(key, body));
      } else {
        const body = parse(SendFileBody, raw, 'body');
        write = await once(key, body, fault, () => store.sendFile(key, body));
      }
      return { ref: write.ref, file_ref: write.file_ref };
    }
    throw new BridgeFailure('TARGET_NOT_FOUND', `no route ${method} ${path}`);
  }

  async function handle(req: http.IncomingMessage, res: http.ServerResponse) {
    const url = new URL(req.url ?? '/', 'http://bridge');
    const method = req.method ?? 'GET';
    const fault = faults.take(`${method} ${url.pathname}`);
    if (faults.preempt(fault, req, res)) return;
    try {
      const answer = await route(method, url.pathname, url.searchParams, req, fault);
      if (Buffer.isBuffer(answer)) {
        res
          .writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': answer.length })
          .end(answer);
      } else {
        sendJson(res, 200, answer);
      }
    } catch (err) {
      if (err instanceof Aborted) {
        req.socket.destroy();
      } else if (err instanceof BridgeFailure) {
        const body: ErrorBody = {
          error: { kind: err.kind, message: err.message, candidates: err.candidates },
        };
        sendJson(res, ERROR_STATUS[err.kind], body);
      } else {
        res.writeHead(500, { 'content-type': 'text/plain' }).end('reference bridge failure');
      }
    }
  }

  const server = http.createServer((req, res) => {
    const job = handle(req, res).finally(() => inflight.delete(job));
    inflight.add(job);
  });
  const host = options.host ?? '127.0.0.1';
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const port = (server.address() as AddressInfo).port;
  let listening = true;

  const stopListening = () =>
    new Promise<void>((resolve) => {
      if (!listening) return resolve();
      listening = false;
      server.close(() => resolve());
      server.closeAllConnections();
    });

  return {
    url: `http://${host}:${port}/`,
    sent: store.sent,
    setFault: faults.set,
    release: () => faults.endDelays(true),
    async idle() {
      while (inflight.size > 0) await Promise.allSettled([...inflight]);
    },
    refuseConnections: stopListening,
    async acceptConnections() {
      if (listening || closed) return;
      await new Promise<void>((resolve) => server.listen(port, host, resolve));
      listening = true;
    },
    async close() {
      closed = true;
      faults.endDelays(false);
      await stopListening();
      await Promise.allSettled([...inflight]);
    },
  };
}
