import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import canonicalize from 'canonicalize';
import { AppError } from '../core/errors.ts';

/**
 * Opaque, tamper-checked page cursors: base64url(JSON payload) + "." + HMAC.
 * A cursor is bound to the tool and to the query it pages through, so it cannot be replayed against
 * another query or altered to skip ahead.
 */
export interface CursorCodec {
  encode(tool: string, query: unknown, position: unknown): string;
  decode<T>(tool: string, query: unknown, cursor: string): T;
  /** Fetches the page after `cursor` (the first without one) and signs the cursor of the next. */
  page<T, P = unknown>(
    tool: string,
    query: unknown,
    cursor: string | undefined,
    fetch: (after: P | undefined) => Promise<{ items: T[]; next: P | null }>,
  ): Promise<{ items: T[]; next_cursor: string | null }>;
}

function queryDigest(tool: string, query: unknown): string {
  return createHash('sha256')
    .update(canonicalize({ tool, query }) ?? '')
    .digest('base64url')
    .slice(0, 16);
}

export function createCursorCodec(secret: string): CursorCodec {
  const sign = (body: string) => createHmac('sha256', secret).update(body).digest('base64url');
  const bad = (reason: string) =>
    new AppError('INVALID_ARGUMENT', 'cursor is not valid for this query', reason);

  const codec: CursorCodec = {
    async page(tool, query, cursor, fetch) {
      const page = await fetch(cursor ? codec.decode(tool, query, cursor) : undefined);
      return { items: page.items, next_cursor: page.next ? codec.encode(tool, query, page.next) : null };
    },
    encode(tool, query, position) {
      const body = Buffer.from(JSON.stringify({ q: queryDigest(tool, query), p: position })).toString(
        'base64url',
      );
      return `${body}.${sign(body)}`;
    },
    decode<T>(tool: string, query: unknown, cursor: string): T {
      const [body, mac, extra] = cursor.split('.');
      if (!body || !mac || extra !== undefined) throw bad('cursor_malformed');
      const expected = Buffer.from(sign(body));
      const given = Buffer.from(mac);
      if (expected.length !== given.length || !timingSafeEqual(expected, given)) throw bad('cursor_tampered');
      let payload: { q?: unknown; p?: unknown };
      try {
        payload = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as typeof payload;
      } catch {
        throw bad('cursor_malformed');
      }
      if (payload.q !== queryDigest(tool, query)) throw bad('cursor_other_query');
      return payload.p as T;
    },
  };
  return codec;
}
