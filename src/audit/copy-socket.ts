import net from 'node:net';

/** Bytes read from the socket at a time: Node's own read size. */
const READ = 64 * 1024;
/** A protocol message's header: its type byte and its length (which counts itself, not the type). */
const HEADER = 5;

/**
 * The export's connection to PostgreSQL as a socket that reads into one buffer, reused read after read.
 * A plain socket gets a fresh 64 KiB ArrayBuffer from Node for each read; pg copies what it needs out
 * of it and drops it, and the dead buffers are freed only by the next scavenge. The export allocates so
 * little on the JavaScript heap that a scavenge came only once about 30 MB of them had piled up (V8's
 * "external memory pressure", `node --trace-gc`): a tenth of `countersign audit export`'s peak RSS.
 *
 * pg's parser keeps a reference to a chunk it was given when the chunk ends in the middle of a message
 * (it finishes the message from the next chunk), so the reused buffer must never reach it that way:
 * each read is handed over as whole messages only, and a message cut by the read's end is carried in a
 * buffer of its own (copied, grown for a message longer than it) and handed over once complete. Every
 * chunk pg sees is then consumed to its end before the callback returns, and the export's own reader
 * (CopyLines) copies what it keeps of a CopyData message.
 *
 * For pg's `stream` option. Only for a connection without TLS (pg wraps the socket for TLS and reads
 * through the wrapper): with `ssl` set, a plain socket is returned.
 */
export function copySocket(config?: { ssl?: unknown }): net.Socket {
  if (config?.ssl) return new net.Socket();
  const read = Buffer.allocUnsafe(READ);
  let carry = Buffer.allocUnsafe(READ);
  let carried = 0;

  /** Appends `src[from..to)` to the carried bytes, growing the carry buffer when a message needs it. */
  const keep = (src: Buffer, from: number, to: number) => {
    if (carried + (to - from) > carry.length) {
      const bigger = Buffer.allocUnsafe(Math.max(carry.length * 2, carried + (to - from)));
      carry.copy(bigger, 0, 0, carried);
      carry = bigger;
    }
    src.copy(carry, carried, from, to);
    carried += to - from;
  };

  /** The length of the message at `at` with its type byte; null (and the socket failed) when malformed. */
  const lengthAt = (src: Buffer, at: number): number | null => {
    const length = 1 + src.readUInt32BE(at + 1);
    if (length >= HEADER) return length;
    socket.destroy(new Error(`a protocol message of length ${length - 1} from the database`));
    return null;
  };

  const callback = (nread: number, buf: Buffer): boolean => {
    let at = 0;
    // First the message a previous read cut: its header, then the rest of its length.
    while (carried > 0 && at < nread) {
      const need = carried < HEADER ? HEADER : lengthAt(carry, 0);
      if (need === null) return false;
      const take = Math.min(need - carried, nread - at);
      keep(buf, at, at + take);
      at += take;
      if (carried < HEADER) continue;
      const length = lengthAt(carry, 0);
      if (length === null) return false;
      if (carried === length) {
        carried = 0;
        socket.emit('data', carry.subarray(0, length));
      } // else: a complete header, and the loop goes round for the message's rest.
    }
    // Then every whole message of the read, in place; a cut one at the end is carried.
    let end = at;
    while (end + HEADER <= nread) {
      const length = lengthAt(buf, end);
      if (length === null) return false;
      if (end + length > nread) break;
      end += length;
    }
    if (end > at) socket.emit('data', buf.subarray(at, end));
    if (end < nread) keep(buf, end, nread);
    return true;
  };

  // Declared after the callbacks, which run only once it exists.
  // `onread` is a constructor option too (Node's net.js), though @types/node lists it for connect only.
  const socket = new net.Socket({ onread: { buffer: read, callback } } as net.SocketConstructorOpts);
  return socket;
}
