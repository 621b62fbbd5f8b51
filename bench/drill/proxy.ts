import net from 'node:net';

export interface CuttableProxy {
  port: number;
  /** Severs every open connection and refuses new ones until restore(). */
  cut(): void;
  restore(): void;
  close(): Promise<void>;
}

/**
 * A TCP proxy in front of PostgreSQL whose connection can be cut and restored: what a network
 * partition or a database failover looks like to the servers behind it.
 */
export function startProxy(target: { host: string; port: number }): Promise<CuttableProxy> {
  const open = new Set<net.Socket>();
  let up = true;
  const server = net.createServer((client) => {
    if (!up) return void client.destroy();
    const upstream = net.connect(target.port, target.host);
    open.add(client);
    open.add(upstream);
    const drop = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
      open.delete(upstream);
    };
    client.on('error', drop).on('close', drop);
    upstream.on('error', drop).on('close', drop);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      resolve({
        port: (server.address() as net.AddressInfo).port,
        cut() {
          up = false;
          for (const s of open) s.destroy();
          open.clear();
        },
        restore() {
          up = true;
        },
        close: () =>
          new Promise<void>((done) => {
            for (const s of open) s.destroy();
            server.close(() => done());
          }),
      });
    });
  });
}
