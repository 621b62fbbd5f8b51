import type http from 'node:http';
import type { z } from 'zod';
import { BridgeFailure } from './reference-data.ts';

const MAX_BODY = 64 * 1024 * 1024;

export function sendJson(res: http.ServerResponse, status: number, body: unknown) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' }).end(JSON.stringify(body));
}

/** Parses a request value; a bad one is the client's INVALID_ARGUMENT. */
export function parse<S extends z.ZodType>(schema: S, value: unknown, what: string): z.output<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success)
    throw new BridgeFailure('INVALID_ARGUMENT', `${what}: ${parsed.error.issues[0]?.message}`);
  return parsed.data;
}

/** The reference bridge's cursors: a base64url offset (a real bridge may put anything there). */
export const encodeCursor = (offset: number) =>
  Buffer.from(JSON.stringify({ o: offset })).toString('base64url');

export function decodeCursor(cursor: string): number {
  try {
    const { o } = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as { o: unknown };
    if (Number.isInteger(o) && (o as number) >= 0) return o as number;
  } catch {
    // falls through to the refusal below
  }
  throw new BridgeFailure('INVALID_ARGUMENT', 'cursor is not one this bridge issued');
}

export async function readJson(req: http.IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) throw new BridgeFailure('INVALID_ARGUMENT', 'request body too large');
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    throw new BridgeFailure('INVALID_ARGUMENT', 'request body is not JSON');
  }
}
