import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { capped, cappedFetch, RESULT_TOO_LARGE } from '../../src/core/fetch.ts';

/**
 * The upstream answer cap on an event stream, byte by byte: events pass whole and unchanged however
 * the stream is cut into chunks (a blank line split between two, `\r\n` line ends), and an event past
 * the cap becomes the error of the request it answered.
 */
describe('cappedFetch on an event stream', () => {
  let server: http.Server;
  let base: string;
  /** What the next answer sends: its chunks, written one by one with a pause between them. */
  let chunks: (string | Buffer)[] = [];

  before(async () => {
    server = http.createServer(async (req, res) => {
      for await (const _ of req); // the request's body
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (const chunk of chunks) {
        res.write(chunk);
        await new Promise((r) => setTimeout(r, 2));
      }
      res.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  });
  after(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const post = (maxBytes: number) =>
    cappedFetch(maxBytes)(base, {
      method: 'POST',
      body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call' }),
    }).then((res) => res.text());

  it('passes events through whole, however the chunks cut them', async () => {
    const events = [
      'event: message\ndata: {"a":1}\n\n',
      'event: message\r\ndata: {"b":"two"}\r\n\r\n',
      'data: {"c":"ünïcödé ✓"}\n\n',
    ];
    const whole = events.join('');
    // Cut after every byte count from 1 to 9: blank lines and multi-byte characters split every way.
    for (let size = 1; size < 10; size++) {
      const bytes = Buffer.from(whole);
      chunks = [];
      for (let i = 0; i < bytes.length; i += size) chunks.push(bytes.subarray(i, i + size));
      assert.equal(await post(1024), whole, `chunks of ${size} bytes`);
    }
  });

  it('counts each event apart: many small events pass, one past the cap is the request error', async () => {
    const small = 'data: {"n":"0123456789"}\n\n';
    chunks = [small.repeat(50)];
    assert.equal(await post(100), small.repeat(50), 'each event is under the cap, though all are not');

    chunks = [small, 'data: {"big":"', 'x'.repeat(300), 'x'.repeat(300), '"}\n\n'];
    const text = await post(200);
    assert.ok(text.startsWith(small), 'the event before the big one went through');
    const error = JSON.parse(/data: (.*)\n\n$/.exec(text.slice(small.length))![1]!) as {
      id: number;
      error: { data: Record<string, number> };
    };
    assert.equal(error.id, 7);
    assert.equal(error.error.data[RESULT_TOO_LARGE], 200);
    assert.ok(!text.includes('xxx'), 'nothing of the big event');
  });
});

describe('cappedFetch reading an answer already queued', () => {
  it('lets the event loop turn every 256 KiB, not only once the whole answer is read', async () => {
    // 8 MiB already in the stream's queue, as an upstream faster than the server leaves it: read in
    // one go, every other call would wait until the last chunk was worked through.
    const chunk = new Uint8Array(64 * 1024).fill(0x78);
    const queued = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < 128; i++) controller.enqueue(chunk);
        controller.close();
      },
    });
    let turns = 0;
    let reading = true;
    const turn = () => {
      turns++;
      if (reading) setImmediate(turn);
    };
    setImmediate(turn);
    const read = await new Response(capped(queued, false, () => 1, 16 * 1024 * 1024)).arrayBuffer();
    reading = false;
    assert.equal(read.byteLength, 8 * 1024 * 1024, 'the whole answer, under the cap');
    // 8 MiB in steps of 256 KiB: 32 turns (without the steps: one, after the whole answer).
    assert.ok(turns >= 30, `${turns} turns of the event loop while 8 MiB were read`);
  });
});

describe('cappedFetch holding a large event', () => {
  /** `text` as a stream of 64 KiB chunks, all queued at once. */
  const queued = (text: string) => {
    const bytes = Buffer.from(text);
    return new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < bytes.length; i += 64 * 1024)
          controller.enqueue(bytes.subarray(i, i + 64 * 1024));
        controller.close();
      },
    });
  };
  const event = (fill: string, n: number) => `event: message\ndata: {"x":"${fill.repeat(n)}"}\n\n`;

  it('passes events of megabytes through byte for byte, two streams at once', async () => {
    // Past 256 KiB an event is held in a scratch buffer of the cap's size, reused once it is passed on.
    const one = event('a', 1024 * 1024) + event('b', 700 * 1024) + event('c', 10);
    const two = event('d', 900 * 1024) + event('e', 1500 * 1024);
    const read = (text: string) => new Response(capped(queued(text), true, () => 1, 2 * 1024 * 1024)).text();
    const [a, b] = await Promise.all([read(one), read(two)]);
    assert.ok(a === one, 'the first stream whole');
    assert.ok(b === two, 'the second stream whole');
    assert.ok((await read(two)) === two, 'again, from the buffers given back');
  });
});
