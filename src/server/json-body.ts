import type { IncomingMessage } from 'node:http';
import type { Problem } from '../core/problem.ts';

/** The request's parsed JSON body (undefined when it has none, or is not JSON), or why it is refused. */
export type BodyRead = { body: unknown } | { problem: Problem };

const JSON_TYPE = /^\s*application\/json\s*(;|$)/i;
const CHARSET = /;\s*charset\s*=\s*"?([^";\s]+)/i;

const malformed: Problem = {
  code: 'INVALID_ARGUMENT',
  reason: 'malformed_json',
  title: 'Malformed JSON',
  detail: 'the request body is not valid JSON',
};

const unsupported = (reason: string, detail: string): Problem => ({
  code: 'INVALID_ARGUMENT',
  reason,
  status: 415,
  title: 'Unsupported Media Type',
  detail,
});

/**
 * Reads and parses a JSON request body of at most `limit` bytes, as the MCP endpoint needs it: a body
 * that is not `application/json` is left unread (undefined) for the SDK to answer; UTF-8 only, no
 * content encoding; an object or an array at the top (an empty body is `{}`). A body over the limit is
 * refused as soon as it is known to be (413), and the rest is read and dropped so the answer can be sent.
 */
export function readJsonBody(req: IncomingMessage, limit: number): Promise<BodyRead> {
  const type = req.headers['content-type'];
  const hasBody =
    req.headers['transfer-encoding'] !== undefined || req.headers['content-length'] !== undefined;
  if (!type || !JSON_TYPE.test(type) || !hasBody) return Promise.resolve({ body: undefined });
  const charset = CHARSET.exec(type)?.[1]?.toLowerCase();
  if (charset && charset !== 'utf-8' && charset !== 'utf8')
    return Promise.resolve({
      problem: unsupported('unsupported_charset', `charset "${charset}": send UTF-8`),
    });
  const encoding = req.headers['content-encoding']?.toLowerCase();
  if (encoding && encoding !== 'identity')
    return Promise.resolve({
      problem: unsupported('unsupported_encoding', `content encoding "${encoding}": send the body as is`),
    });
  const tooLarge: Problem = {
    code: 'INVALID_ARGUMENT',
    reason: 'body_too_large',
    status: 413,
    title: 'Request body too large',
    detail: `limit ${limit} bytes`,
  };
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let settled = false;
    const settle = (read: BodyRead) => {
      if (!settled) resolve(read);
      settled = true;
    };
    if (Number(req.headers['content-length']) > limit) settle({ problem: tooLarge });
    req.on('data', (chunk: Buffer) => {
      if (settled) return;
      size += chunk.length;
      if (size > limit) return settle({ problem: tooLarge });
      chunks.push(chunk);
    });
    req.on('end', () => settle(parse(Buffer.concat(chunks, size))));
    // The client went away: nobody reads the answer, but the request is refused, not served.
    req.on('error', () => settle({ problem: malformed }));
  });
}

function parse(bytes: Buffer): BodyRead {
  if (bytes.length === 0) return { body: {} };
  const text = bytes.toString('utf8');
  // Strict, as express.json was: a JSON-RPC message or batch, never a bare value.
  const first = /\S/.exec(text)?.[0];
  if (first !== '{' && first !== '[') return { problem: malformed };
  try {
    return { body: JSON.parse(text) as unknown };
  } catch {
    return { problem: malformed };
  }
}
