import { once } from 'node:events';
import type { Writable } from 'node:stream';
import type pg from 'pg';

/**
 * COPY … TO STDOUT and COPY … FROM STDIN on a plain `pg` client, without a dependency: pg accepts any
 * object with `submit(connection)` as a query and hands it the protocol messages.
 */
interface Connection {
  query(text: string): void;
  sendCopyFromChunk(chunk: Buffer): void;
  endCopyFrom(): void;
  sendCopyFail(message: string): void;
  stream: Writable & { pause(): void; resume(): void };
}

abstract class Copy {
  callback?: (err: Error | null) => void;
  protected error: Error | null = null;
  constructor(private readonly text: string) {}
  submit(connection: Connection) {
    connection.query(this.text);
  }
  handleError(err: Error) {
    this.error ??= err;
  }
  handleReadyForQuery() {
    this.callback?.(this.error);
  }
  handleCommandComplete() {}
  handleRowDescription() {}
  handleDataRow() {}
  handlePortalSuspended() {}
  handleEmptyQuery() {}
  handleCopyInResponse(connection: Connection) {
    connection.sendCopyFail('not a COPY FROM');
  }
  handleCopyData(_msg: { chunk: Buffer }, _connection: Connection) {}
  run(client: pg.Client): Promise<void> {
    return new Promise((resolve, reject) => {
      this.callback = (err) => (err ? reject(err) : resolve());
      void client.query(this as unknown as pg.QueryConfig);
    });
  }
}

/** COPY (…) TO STDOUT, every chunk written to `out`; resolves with the bytes copied. */
export async function copyOut(client: pg.Client, sql: string, out: Writable): Promise<number> {
  let bytes = 0;
  let paused = false;
  const copy = new (class extends Copy {
    override handleCopyData(msg: { chunk: Buffer }, connection: Connection) {
      bytes += msg.chunk.length;
      if (!out.write(msg.chunk) && !paused) {
        // The file is behind: stop reading from the server until it catches up.
        paused = true;
        connection.stream.pause();
        out.once('drain', () => {
          paused = false;
          connection.stream.resume();
        });
      }
    }
  })(sql);
  await copy.run(client);
  if (out.writableNeedDrain) await once(out, 'drain');
  return bytes;
}

/** COPY … FROM STDIN, fed from `chunks` (text format), with the socket's backpressure respected. */
export async function copyIn(client: pg.Client, sql: string, chunks: AsyncIterable<string>): Promise<void> {
  const copy = new (class extends Copy {
    override handleCopyInResponse(connection: Connection) {
      void (async () => {
        try {
          for await (const chunk of chunks) {
            connection.sendCopyFromChunk(Buffer.from(chunk));
            if (connection.stream.writableNeedDrain) await once(connection.stream, 'drain');
          }
          connection.endCopyFrom();
        } catch (err) {
          connection.sendCopyFail(String(err));
        }
      })();
    }
  })(sql);
  await copy.run(client);
}
