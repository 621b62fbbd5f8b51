import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Balancer {
  url: string;
  /** Requests forwarded to each target URL so far. */
  hits: Map<string, number>;
  close(): Promise<void>;
}

/**
 * A plain round-robin HTTP balancer, as most load balancers are by default: every request goes to the
 * next target in turn, with no session affinity. Bodies are streamed both ways (SSE answers included).
 */
export async function startBalancer(targets: readonly string[]): Promise<Balancer> {
  let next = 0;
  const hits = new Map<string, number>(targets.map((t) => [t, 0]));
  const server = http.createServer((req, res) => {
    const target = new URL(targets[next++ % targets.length]!);
    hits.set(target.origin, (hits.get(target.origin) ?? 0) + 1);
    const upstream = http.request(
      {
        host: target.hostname,
        port: target.port,
        method: req.method,
        path: req.url,
        headers: { ...req.headers, host: target.host },
      },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on('error', () => {
      if (!res.headersSent) res.writeHead(502).end();
      else res.destroy();
    });
    res.on('close', () => upstream.destroy());
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    hits,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
