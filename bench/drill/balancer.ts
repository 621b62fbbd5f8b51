import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

export interface BalancerStats {
  /** Requests received from clients. */
  requests: number;
  /** Connection attempts that failed before a replica accepted the connection, sent on to the next one. */
  retried: number;
  /** Requests answered 502 by the balancer itself: no replica took the connection, or the one that had
   * the request went away before it answered. */
  bad_gateway: number;
  /** Answers cut off mid-body because the replica went away while streaming them. */
  cut_short: number;
  /** Requests forwarded, per replica URL. */
  per_replica: Record<string, number>;
}

export interface Balancer {
  /** The balancer's own base URL (http://127.0.0.1:port). */
  url: string;
  stats: BalancerStats;
  close(): Promise<void>;
}

/** The code of the balancer's own problem answers (a 502 names no replica's error: the answer was lost). */
export const BAD_GATEWAY_CODE = 'bad_gateway';

/** Headers that describe one hop, not the message: never forwarded (RFC 9110 §7.6.1). */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'upgrade',
]);

function endToEnd(headers: http.IncomingHttpHeaders): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) if (!HOP_BY_HOP.has(name)) out[name] = value;
  return out;
}

function badGateway(res: http.ServerResponse, detail: string): void {
  if (res.headersSent) return void res.destroy();
  const body = JSON.stringify({
    type: `urn:countersign-drill:problem:${BAD_GATEWAY_CODE}`,
    title: 'Bad gateway',
    status: 502,
    detail,
    code: BAD_GATEWAY_CODE,
  });
  res.writeHead(502, { 'content-type': 'application/problem+json', 'x-drill-balancer': '1' });
  res.end(body);
}

/**
 * A round-robin HTTP reverse proxy on 127.0.0.1, what sits in front of stateless replicas in production:
 * each request goes to the next replica in turn (no affinity of any kind), its body streamed to the
 * replica and the answer (JSON, or an SSE stream) streamed back as it comes.
 *
 * `replicas()` lists the replicas that are up. With `healthCheckMs`, the balancer reads it only that
 * often, as a balancer's health check does: a replica killed since stays in the rotation until the next
 * check, and one restarted joins at the next. A request whose connection a replica refuses (it is down)
 * is sent to the next replica in turn — it has reached no replica, so sending it again cannot do
 * anything twice. Once a replica has accepted the connection the request is never sent again (a POST
 * may have been acted on, which is also what nginx does by default for non-idempotent requests): if
 * that replica goes away before it answers, the client gets a 502 problem answer with code
 * `bad_gateway`; if it goes away in the middle of its answer, the client's connection is cut, so that a
 * truncated answer is never taken for a whole one.
 */
export function startBalancer(
  replicas: () => string[],
  opts: { healthCheckMs?: number } = {},
): Promise<Balancer> {
  let turn = 0;
  let checked = replicas();
  const check = opts.healthCheckMs
    ? setInterval(() => (checked = replicas()), opts.healthCheckMs).unref()
    : undefined;
  const rotation = () => (check ? checked : replicas());
  const stats: BalancerStats = { requests: 0, retried: 0, bad_gateway: 0, cut_short: 0, per_replica: {} };
  const clientSockets = new Set<Socket>();
  const upstreams = new Set<http.ClientRequest>();

  const server = http.createServer((req, res) => {
    stats.requests++;
    // The body as received so far: a request whose connection is refused is sent again, whole, elsewhere.
    const body: Buffer[] = [];
    let bodyEnded = false;
    let current: http.ClientRequest | undefined;
    let answered = false;

    req.on('data', (chunk: Buffer) => {
      body.push(chunk);
      if (current && !current.write(chunk)) {
        req.pause();
        current.once('drain', () => req.resume());
      }
    });
    req.on('end', () => {
      bodyEnded = true;
      current?.end();
    });
    // The client went away: so does its request to the replica.
    let clientGone = false;
    res.on('close', () => {
      if (res.writableFinished) return;
      clientGone = true;
      current?.destroy();
    });

    const tried = new Set<string>();
    const first = turn++;

    const attempt = () => {
      // This request's turn; after a refused connection, the replicas after it that it has not tried.
      const live = rotation();
      const order = live.map((_, i) => live[(first + i) % live.length]!);
      const next = order.find((url) => !tried.has(url));
      if (next === undefined) {
        stats.bad_gateway++;
        return badGateway(
          res,
          live.length === 0 ? 'no replica is up' : 'every replica refused the connection',
        );
      }
      tried.add(next);
      const target = new URL(next);
      stats.per_replica[target.origin] = (stats.per_replica[target.origin] ?? 0) + 1;
      let connected = false;
      const up = http.request({
        host: target.hostname,
        port: target.port,
        method: req.method,
        path: req.url,
        headers: { ...endToEnd(req.headers), 'x-forwarded-for': req.socket.remoteAddress ?? '' },
        // One connection per request: a pooled connection to a replica killed since would fail after
        // "connecting", and the request could not be told apart from one the replica had received.
        agent: false,
      });
      current = up;
      upstreams.add(up);
      up.on('socket', (socket: Socket) => {
        if (!socket.connecting) connected = true;
        else socket.once('connect', () => (connected = true));
      });
      up.on('response', (answer) => {
        answered = true;
        res.writeHead(answer.statusCode ?? 502, answer.statusMessage, endToEnd(answer.headers));
        res.flushHeaders();
        answer.pipe(res);
        // Cut short (the replica died mid-answer): cut the client's connection too, never end it cleanly.
        answer.on('error', () => undefined);
        answer.on('close', () => {
          if (answer.complete || clientGone) return;
          stats.cut_short++;
          res.destroy();
        });
      });
      up.on('error', (err: NodeJS.ErrnoException) => {
        upstreams.delete(up);
        if (answered || res.destroyed) return void res.destroy();
        if (!connected) {
          stats.retried++;
          current = undefined;
          return attempt();
        }
        stats.bad_gateway++;
        badGateway(res, `the replica went away before it answered (${err.code ?? err.message})`);
      });
      up.on('close', () => upstreams.delete(up));
      for (const chunk of body) up.write(chunk);
      if (bodyEnded) up.end();
      else if (req.isPaused()) req.resume(); // paused for a replica that refused: this one takes it
    };
    attempt();
  });
  server.keepAliveTimeout = 30_000;
  server.on('connection', (socket: Socket) => {
    clientSockets.add(socket);
    socket.on('close', () => clientSockets.delete(socket));
  });

  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      resolve({
        url: `http://127.0.0.1:${port}`,
        stats,
        close: () =>
          new Promise<void>((done) => {
            clearInterval(check);
            for (const up of upstreams) up.destroy();
            for (const s of clientSockets) s.destroy();
            server.close(() => done());
          }),
      });
    });
  });
}
