import type { IncomingMessage, ServerResponse } from 'node:http';
import { sendProblem } from '../core/problem.ts';
import { VERSION } from '../core/version.ts';

/** Seconds a client is asked to wait before it tries a server that is still starting. */
export const STARTING_RETRY_AFTER_S = 2;

/**
 * What a bound server answers until its services are ready (the database opened and migrated): every
 * request gets 503 with Retry-After, so that nothing waits on a socket that is not served yet. /healthz
 * says `starting`; anything else is a problem document with SOURCE_UNAVAILABLE, reason `starting`.
 */
export function answerStarting(req: IncomingMessage, res: ServerResponse, since: Date): void {
  // The body is not needed; read it so that the connection can carry the client's next request.
  req.resume();
  const headers = { 'Retry-After': String(STARTING_RETRY_AFTER_S), 'Cache-Control': 'no-store' };
  if (new URL(req.url ?? '/', 'http://localhost').pathname === '/healthz') {
    const body = JSON.stringify({
      status: 'starting',
      version: VERSION,
      uptime_s: Math.round((Date.now() - since.getTime()) / 1000),
    });
    res
      .writeHead(503, {
        ...headers,
        'Content-Type': 'application/json; charset=utf-8',
        'Content-Length': Buffer.byteLength(body),
      })
      .end(body);
    return;
  }
  sendProblem(
    res,
    {
      code: 'SOURCE_UNAVAILABLE',
      reason: 'starting',
      title: 'Starting',
      detail: `the server is starting; retry in ${STARTING_RETRY_AFTER_S} s`,
    },
    headers,
  );
}
