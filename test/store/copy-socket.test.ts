import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { describe, it } from 'node:test';
import knexFactory from 'knex';
// @ts-expect-error -- pg ships no types for its connection-parameters module: how pg.Client reads its settings
import ConnectionParameters from 'pg/lib/connection-parameters.js';
import { copySocket } from '../../src/audit/copy-socket.ts';
import { copyClientConfig } from '../../src/audit/export-copy.ts';

/** A protocol message: type byte, length (counting itself), body. */
function message(type: string, body: Buffer): Buffer {
  const m = Buffer.alloc(5 + body.length);
  m.write(type, 0, 'latin1');
  m.writeUInt32BE(4 + body.length, 1);
  body.copy(m, 5);
  return m;
}

/** The whole messages at the start of `chunk`, or null when it ends inside one. */
function wholeMessages(chunk: Buffer): number | null {
  let n = 0;
  let at = 0;
  while (at < chunk.length) {
    if (at + 5 > chunk.length) return null;
    at += 1 + chunk.readUInt32BE(at + 1);
    n++;
  }
  return at === chunk.length ? n : null;
}

/** Sends `bytes` in pieces of the given sizes to a copySocket; returns the chunks it emitted, copied. */
async function received(bytes: Buffer, pieces: number[]): Promise<Buffer[]> {
  const server = net.createServer(async (conn) => {
    conn.setNoDelay(true);
    let at = 0;
    for (const size of pieces) {
      if (at >= bytes.length) break;
      conn.write(bytes.subarray(at, at + size));
      at += size;
      // Let each piece arrive as its own read.
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
    conn.end(bytes.subarray(at));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const socket = copySocket({ ssl: false });
  const chunks: Buffer[] = [];
  // Copied at once: the socket's buffers are reused after the listener returns.
  socket.on('data', (c: Buffer) => chunks.push(Buffer.from(c)));
  socket.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  await once(socket, 'end');
  socket.destroy();
  server.close();
  return chunks;
}

describe('the export connection reusing one read buffer', () => {
  // Short and long messages, one longer than a read (64 KiB), one with an empty body.
  const bodies = [10, 0, 700, 3, 70_000, 900, 200_000, 1, 64 * 1024 - 5, 12];
  const stream = Buffer.concat(
    bodies
      .map((n, i) => message('d', Buffer.alloc(n, (i * 37 + n) % 251)))
      .concat(message('c', Buffer.alloc(0))),
  );

  for (const [name, pieces] of [
    ['one byte at a time, for a start', [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 2, 1]],
    ['cut inside a header', [3, 4, 2, 713, 2]],
    ['cut in long messages', [40_000, 50_000, 100_000, 7, 150_000]],
    ['whole', [stream.length]],
  ] as const) {
    it(`hands over only whole messages, every byte in order: ${name}`, async () => {
      const chunks = await received(stream, [...pieces]);
      for (const c of chunks) assert.notEqual(wholeMessages(c), null, 'a chunk ends inside a message');
      assert.deepEqual(Buffer.concat(chunks), stream);
    });
  }

  it('fails the connection on a malformed message length', async () => {
    const bad = Buffer.from([0x64, 0, 0, 0, 2, 0x41]);
    const server = net.createServer((conn) => conn.end(bad));
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const socket = copySocket({});
    socket.on('data', () => assert.fail('a malformed message was handed over'));
    socket.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    const [err] = (await once(socket, 'error')) as [Error];
    assert.match(err.message, /length 2/);
    server.close();
  });

  it('is a plain socket for a TLS connection (pg reads through its TLS wrapper)', () => {
    const socket = copySocket({ ssl: true });
    assert.ok(socket instanceof net.Socket);
    socket.destroy();
  });
});

describe("the export connection's settings", () => {
  // knex keeps a connection's password as a non-enumerable property: the COPY's settings once lost it to
  // a spread, and the export was refused by every PostgreSQL that asks for a password (the container's).
  it('carry the password of the URL the database was opened with', async () => {
    const knex = knexFactory({
      client: 'pg',
      connection: 'postgres://auditor:s3cr%2Ft@db.invalid:5432/countersign',
    });
    try {
      const config = copyClientConfig(knex);
      const params = new ConnectionParameters(config);
      assert.equal(params.password, 's3cr/t');
      assert.equal(params.user, 'auditor');
      assert.equal(params.host, 'db.invalid');
      assert.equal(params.database, 'countersign');
      assert.equal(config.stream, copySocket);
    } finally {
      await knex.destroy();
    }
  });
});
