import type { NextFunction, Request, Response } from 'express';
import { validateHostHeader, validateOriginHeader } from '@modelcontextprotocol/server';
import type { Config } from '../config.ts';
import { sendProblem, type Problem } from '../core/problem.ts';

/*
 * The Host and Origin check every HTTP route of this server passes: the MCP endpoint (server/http.ts)
 * asks hostCheck, and the pages, /healthz and /metrics are guarded by hostGuard (web/app.ts,
 * app/serve-http.ts).
 */

/**
 * Host and Origin must name this server, so a web page cannot reach a loopback countersign by DNS
 * rebinding: the refusal for a request whose headers do not, else undefined.
 */
export function hostCheck(
  config: Config,
): (host: string | undefined, origin: string | undefined) => Problem | undefined {
  // The SDK compares hostnames as the URL parser gives them: lower case, the port left out.
  const allowed = config.http.allowed_hosts.map((h) => h.toLowerCase());
  return (host, origin) => {
    if (!validateHostHeader(host, allowed).ok) {
      return {
        code: 'PERMISSION_DENIED',
        reason: 'host_not_allowed',
        title: 'Host not allowed',
        detail: `Host "${host ?? ''}" is not served here`,
      };
    }
    if (!validateOriginHeader(origin, allowed).ok) {
      return {
        code: 'PERMISSION_DENIED',
        reason: 'origin_not_allowed',
        title: 'Origin not allowed',
        detail: `Origin "${origin}" is not allowed`,
      };
    }
    return undefined;
  };
}

/**
 * Whether an Origin is this server's own, scheme, host and port alike: the origin the request's Host
 * names (https when web.secure_cookies says the pages are served over TLS, else http), or that of
 * http.public_url. A page on another port of the same host is another origin.
 */
function ownOrigin(config: Config): (host: string, origin: string) => boolean {
  const scheme = config.web.secure_cookies ? 'https' : 'http';
  const publicOrigin = config.http.public_url ? new URL(config.http.public_url).origin : undefined;
  const originOf = (url: string) => {
    try {
      return new URL(url).origin;
    } catch {
      return undefined;
    }
  };
  return (host, origin) => {
    const given = originOf(origin);
    return given !== undefined && (given === publicOrigin || given === originOf(`${scheme}://${host}`));
  };
}

/**
 * hostCheck as express middleware, for the pages, /healthz and /metrics. With `sameOrigin` (the pages,
 * whose POSTs a session cookie authorises) an Origin must moreover be this server's own (ownOrigin).
 */
export function hostGuard(config: Config, opts: { sameOrigin?: boolean } = {}) {
  const check = hostCheck(config);
  const isOwn = ownOrigin(config);
  return (req: Request, res: Response, next: NextFunction) => {
    const host = req.get('host');
    const origin = req.get('origin');
    const problem = check(host, origin);
    if (problem) return sendProblem(res, problem);
    if (opts.sameOrigin && origin !== undefined && host !== undefined && !isOwn(host, origin)) {
      return sendProblem(res, {
        code: 'PERMISSION_DENIED',
        reason: 'origin_not_allowed',
        title: 'Origin not allowed',
        detail: `Origin "${origin}" is not this server's (scheme, host and port must match)`,
      });
    }
    next();
  };
}
