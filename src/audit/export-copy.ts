import pg from 'pg';
import { dialectOf, type Connection as Pool } from '../db/knex.ts';
import { copySocket } from './copy-socket.ts';
import type { ExportFilter } from './export-filter.ts';
import { exportLines } from './export-pages.ts';
import { bytesOf, copyWords, type Bytes } from './bytes.ts';
import { int8, LineRenderer, RAW_COLUMNS } from './export-render.ts';
import { events } from './store/index.ts';

/** A run of exported rows: their bytes, each row's hash and a newline, and the run's first and last row. */
export interface ExportChunk {
  data: string | Buffer;
  hashes: string | Buffer;
  rows: number;
  first: number;
  last: { seq: number; hash: string };
  /** Called once `data` is written and `hashes` digested: their memory is then reused. */
  done?: () => void;
}

/**
 * Chunks handed over as strings stay well under 128 KiB: larger strings go to V8's large-object space,
 * which only a full collection frees. Buffers live outside the heap: cut larger, for fewer writes.
 */
const CHUNK = 32 * 1024;
const BUFFER = 64 * 1024;
/** Rows in one chunk at most (a line is several hundred bytes: BUFFER fills first). */
const MAX_ROWS = 256;
/** Chunks decoded ahead of the consumer before the socket is paused (memory stays flat). */
const HIGH_WATER = 8;
/**
 * Written chunks' buffers kept for reuse. Allocated afresh, buffers would be freed only when a
 * collection finds them, and tens of MB of them would wait for it (peak RSS counts them).
 */
const SPARE = 32;
/** The binary COPY header's fixed part: signature, flags, header extension length. */
const SIGNATURE = Buffer.from('PGCOPY\n\xff\r\n\0', 'latin1');
const HEADER_BYTES = SIGNATURE.length + 8;
/** The columns of RAW_COLUMNS: the line's fields in its order. */
const FIELDS = RAW_COLUMNS.count;
const NEWLINE = 0x0a;

/** Pages of lines (the paged path, and CSV) as chunks of at most CHUNK characters. */
export async function* pageChunks(
  pages: AsyncIterable<{ seq: number; hash: string; line: string }[]>,
): AsyncGenerator<ExportChunk> {
  for await (const page of pages) {
    let start = 0;
    let data = '';
    let hashes = '';
    for (let i = 0; i < page.length; i++) {
      data += page[i]!.line;
      hashes += `${page[i]!.hash}\n`;
      if (data.length > CHUNK || i === page.length - 1) {
        const last = page[i]!;
        yield {
          data,
          hashes,
          rows: i + 1 - start,
          first: page[start]!.seq,
          last: { seq: last.seq, hash: last.hash },
        };
        start = i + 1;
        data = '';
        hashes = '';
      }
    }
  }
}

/** Assembles the JSONL lines of binary COPY tuples (LineRenderer) into BUFFER-sized buffers. */
class LineChunks {
  private readonly spare: { data: Buffer; hashes: Bytes }[] = [];
  private data: Buffer = Buffer.allocUnsafe(BUFFER);
  private hashes: Bytes = bytesOf(Buffer.allocUnsafe(65 * MAX_ROWS));
  private pos = 0;
  private rows = 0;
  private first = 0;
  private lastSeq = 0;
  private readonly renderer = new LineRenderer();

  constructor(private readonly emit: (chunk: ExportChunk) => void) {}

  /** One tuple of `tupleBytes`: fields at `start[i]`..`end[i]` of `input` (start -1: NULL). */
  row(input: Bytes, start: Int32Array, end: Int32Array, tupleBytes: number): void {
    const seq = int8(input.view, start[RAW_COLUMNS.seq]!);
    const bytes = this.renderer.bound(input, start, end, tupleBytes);
    if (this.pos + bytes > this.data.length || this.rows === MAX_ROWS) this.flush();
    if (bytes > this.data.length) this.data = Buffer.allocUnsafe(bytes); // one long row: not kept
    if (this.rows === 0) this.first = seq;
    this.pos = this.renderer.write(input, start, end, this.data, this.pos);
    const hash = RAW_COLUMNS.hash;
    if (end[hash]! - start[hash]! !== 64) throw new Error(`a row's hash is not 64 hex digits (seq ${seq})`);
    const at = copyWords(input, start[hash]!, end[hash]!, this.hashes, this.rows * 65);
    this.hashes.bytes[at] = NEWLINE;
    this.rows++;
    this.lastSeq = seq;
  }

  flush(): void {
    if (this.rows === 0) return;
    const used = { data: this.data, hashes: this.hashes };
    const hashes = (this.hashes.bytes as Buffer).subarray(0, this.rows * 65);
    this.emit({
      data: this.data.subarray(0, this.pos),
      hashes,
      rows: this.rows,
      first: this.first,
      last: { seq: this.lastSeq, hash: hashes.toString('latin1', hashes.length - 65, hashes.length - 1) },
      done: () => {
        if (used.data.length === BUFFER && this.spare.length < SPARE) this.spare.push(used);
      },
    });
    const next = this.spare.pop();
    this.data = next?.data ?? Buffer.allocUnsafe(BUFFER);
    this.hashes = next?.hashes ?? bytesOf(Buffer.allocUnsafe(65 * MAX_ROWS));
    this.pos = 0;
    this.rows = 0;
  }
}

interface Connection {
  query(text: string): void;
  stream: { pause(): void; resume(): void; destroy(): void };
}

/**
 * `COPY (…) TO STDOUT (FORMAT binary)` as a query object pg runs (pg hands any object with `submit`
 * the protocol messages). Binary, not text: fields arrive as the bytes the database wrote, with no
 * escaping to undo. A tuple may span CopyData messages; the header may share one with the first tuple.
 */
class CopyLines {
  callback?: (err: Error | null) => void;
  connection?: Connection;
  private error: Error | null = null;
  private rest: Buffer | null = null;
  private headerRead = false;
  private readonly start = new Int32Array(FIELDS);
  private readonly end = new Int32Array(FIELDS);
  private memory: ArrayBufferLike | undefined;
  private whole: Bytes = bytesOf(Buffer.alloc(0));

  constructor(
    private readonly text: string,
    private readonly lines: LineChunks,
  ) {}

  submit(connection: Connection) {
    this.connection = connection;
    connection.query(this.text);
  }
  handleError(err: Error) {
    this.error ??= err;
    // A lost connection sends no ReadyForQuery: settle now (the caller discards the connection).
    this.callback?.(this.error);
  }
  handleReadyForQuery() {
    if (!this.error) this.lines.flush();
    this.callback?.(this.error);
  }
  handleCommandComplete() {}
  handleRowDescription() {}
  handleDataRow() {}
  handlePortalSuspended() {}
  handleEmptyQuery() {}
  handleCopyInResponse() {}

  /**
   * One CopyData message: PostgreSQL sends a message per row, each a slice of pg's read buffer. The
   * tuples are decoded in place, at their offsets in that buffer, through one Buffer and DataView per
   * read buffer rather than per message (`reading`): the renderer then reuses its view row after row.
   */
  handleCopyData(msg: { chunk: Buffer }) {
    if (this.error) return;
    try {
      const buf = this.rest ? Buffer.concat([this.rest, msg.chunk]) : msg.chunk;
      const whole = this.reading(buf);
      const from = buf.byteOffset - whole.bytes.byteOffset;
      const to = from + buf.length;
      const at = this.tuples(whole, from, to);
      // pg reuses its read buffer: what is kept for the next message is copied.
      this.rest = at < to ? Buffer.from(whole.bytes.subarray(at, to)) : null;
    } catch (err) {
      this.error = err as Error;
    }
  }

  /** `buf`'s whole underlying memory as a Buffer with a DataView, made once per memory. */
  private reading(buf: Buffer): Bytes {
    if (buf.buffer !== this.memory) {
      this.memory = buf.buffer;
      this.whole = bytesOf(Buffer.from(buf.buffer));
    }
    return this.whole;
  }

  /** Decodes the whole tuples of `buf[at..limit)`; returns where the first incomplete one starts. */
  private tuples(bytes: Bytes, at: number, limit: number): number {
    const buf = bytes.bytes as Buffer;
    const view = bytes.view;
    if (!this.headerRead) {
      if (limit - at < HEADER_BYTES) return at;
      if (SIGNATURE.compare(buf, at, at + SIGNATURE.length) !== 0)
        throw new Error('not a binary COPY stream');
      const body = at + HEADER_BYTES + view.getUint32(at + HEADER_BYTES - 4); // after the header extension
      if (limit < body) return at;
      at = body;
      this.headerRead = true;
    }
    const { start, end } = this;
    for (;;) {
      if (at + 2 > limit) return at;
      const fields = view.getInt16(at);
      if (fields === -1) return limit; // the trailer
      if (fields !== FIELDS) throw new Error(`binary COPY tuple of ${fields} fields, not ${FIELDS}`);
      let p = at + 2;
      for (let f = 0; f < FIELDS; f++) {
        if (p + 4 > limit) return at;
        const len = view.getInt32(p);
        p += 4;
        start[f] = len === -1 ? -1 : p;
        if (len > 0) p += len;
        end[f] = p;
        if (p > limit) return at;
      }
      this.lines.row(bytes, start, end, p - at);
      at = p;
    }
  }
}

/** A filter value PostgreSQL cannot take as text (NUL): left to the parameterised path to refuse. */
const copyable = (filter: ExportFilter) => !Object.values(filter).some((v) => String(v).includes('\0'));

/**
 * The JSONL lines of the filter's rows up to `maxSeq` as chunks, streamed by one COPY on PostgreSQL:
 * the database sends the rows' columns as they are stored, in one statement (one snapshot) and one
 * stream, instead of a query per page, and LineRenderer writes each line from their bytes. The socket is paused while HIGH_WATER chunks wait, so a
 * slow consumer holds the database back rather than filling memory. The COPY has a connection of its
 * own, not one of the pool's: a reader that stops early leaves it mid-stream, and it is simply closed.
 */
/**
 * The COPY's own connection settings: the pool's, with a socket that reads into one reused buffer
 * (copySocket), so that no dead 64 KiB read buffers pile up. knex keeps the password as a
 * non-enumerable property (so that it stays out of logs): a spread would drop it, and a server that asks
 * for a password would then refuse the export ("client password must be a string").
 */
export function copyClientConfig(knex: Pool): pg.ClientConfig {
  const connection = knex.client.config.connection as string | pg.ClientConfig;
  if (typeof connection === 'string') return { connectionString: connection, stream: copySocket };
  return { ...connection, password: connection.password, stream: copySocket };
}

async function* copyChunks(knex: Pool, filter: ExportFilter, maxSeq: number): AsyncGenerator<ExportChunk> {
  const client = new pg.Client(copyClientConfig(knex));
  // Failures reach the COPY as handleError; the client's own 'error' event must not crash the process.
  client.on('error', () => {});
  await client.connect();
  const queue: ExportChunk[] = [];
  let settled: { err: Error | null } | undefined;
  let wake: (() => void) | undefined;
  let paused = false;
  const copy = new CopyLines(
    events.copySql(client, filter, maxSeq, RAW_COLUMNS.sql),
    new LineChunks((chunk) => {
      queue.push(chunk);
      if (queue.length >= HIGH_WATER && !paused) {
        paused = true;
        copy.connection?.stream.pause();
      }
      wake?.();
    }),
  );
  copy.callback = (err) => {
    settled ??= { err };
    wake?.();
  };
  try {
    void client.query(copy as unknown as pg.QueryConfig);
    for (;;) {
      const chunk = queue.shift();
      if (chunk) {
        if (paused && queue.length < HIGH_WATER / 2) {
          paused = false;
          copy.connection?.stream.resume();
        }
        yield chunk;
      } else if (settled?.err) throw settled.err;
      else if (settled) return;
      else await new Promise<void>((resolve) => (wake = resolve));
    }
  } finally {
    // Stopped mid-stream (nothing more is wanted from it) or failed: closed at once, not politely.
    if (settled && !settled.err) await client.end().catch(() => {});
    else copy.connection?.stream.destroy();
  }
}

/**
 * The JSONL lines of the filter's rows up to `maxSeq`, in seq order, as chunks: one COPY on
 * PostgreSQL; pages of queries on PGlite (which has no COPY TO STDOUT to a client) and for a filter
 * value COPY cannot carry. The bytes are the same either way: toJsonLine's, which the tests hold
 * both paths to.
 */
export function exportChunks(knex: Pool, filter: ExportFilter, maxSeq: number): AsyncGenerator<ExportChunk> {
  if (dialectOf(knex) === 'postgres' && copyable(filter)) return copyChunks(knex, filter, maxSeq);
  return pageChunks(exportLines(knex, filter, maxSeq));
}
