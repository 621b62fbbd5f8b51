import { createHash, timingSafeEqual } from 'node:crypto';
import type { NextFunction, Request, Response } from 'express';
import { sendProblem } from '../core/problem.ts';

/**
 * A loopback client: 127.0.0.0/8, ::1, or an IPv4 loopback address mapped into IPv6 (::ffff:127.x.y.z, as
 * a dual-stack listener reports it). Anything else, or no address at all, is not: not 0.0.0.0, not a
 * private network, not a name.
 */
export function isLoopback(address: string | undefined): boolean {
  if (!address) return false;
  const v4 = /^(?:::ffff:)?(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/i.exec(address);
  if (v4) return v4[1] === '127' && v4.slice(2).every((octet) => Number(octet) <= 255);
  // ::1 written short or long, and 127.x mapped but written in hex (::ffff:7f00:1).
  return (
    /^(?:::|(?:0{1,4}:){7}0{0,3})1$/.test(address) || /^::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}$/i.test(address)
  );
}

/** Equal tokens, compared in time that depends on neither their contents nor their lengths. */
function sameToken(given: string, expected: string): boolean {
  const digest = (s: string) => createHash('sha256').update(s).digest();
  return timingSafeEqual(digest(given), digest(expected));
}

/**
 * Who may read /metrics: with `metrics.token` set, any client that sends it as a bearer token; without,
 * loopback clients only (a scraper on the same host, or a proxy in front that decides for itself). The
 * series name tools, error codes and load, which is more than the open internet should learn.
 */
export function metricsGuard(token: string | undefined) {
  return (req: Request, res: Response, next: NextFunction) => {
    if (token === undefined) {
      if (isLoopback(req.socket.remoteAddress)) return next();
      return sendProblem(res, {
        code: 'PERMISSION_DENIED',
        reason: 'metrics_loopback_only',
        title: 'Metrics are served to this host only',
        detail: 'Set metrics.token (COUNTERSIGN_METRICS_TOKEN) to let a scraper on another host in.',
      });
    }
    const match = /^Bearer\s+(\S+)\s*$/i.exec(req.get('authorization') ?? '');
    if (match && sameToken(match[1]!, token)) return next();
    sendProblem(
      res,
      {
        code: 'NOT_LOGGED_IN',
        reason: match ? 'metrics_token_invalid' : 'metrics_token_missing',
        title: match ? 'Wrong metrics token' : 'Metrics token required',
        detail: 'Send the configured metrics.token as "Authorization: Bearer <token>".',
      },
      { 'WWW-Authenticate': 'Bearer realm="countersign-metrics"' },
    );
  };
}
