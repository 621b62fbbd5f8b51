import type { ServerResponse } from 'node:http';
import { problemType } from './answers.ts';
import { HTTP_STATUS, type AppErrorCode } from './errors.ts';

/** An HTTP refusal: a code from core/errors.ts, the machine reason, and words for people. */
export interface Problem {
  code: AppErrorCode;
  /** Stable and specific (missing_token, body_too_large …); the last part of the problem's type (else the code). */
  reason?: string;
  title: string;
  detail?: string;
  /** When the code's usual status (HTTP_STATUS) is not the precise one, e.g. 413 for a body too large. */
  status?: number;
}

/**
 * RFC 9457 problem details: the one way an HTTP refusal is answered, with the same codes as everywhere.
 * Written on node's response, so the MCP endpoint (served ahead of express) and the pages answer alike.
 */
export function sendProblem(
  res: ServerResponse,
  problem: Problem,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent) return;
  const status = problem.status ?? HTTP_STATUS[problem.code];
  const body = JSON.stringify({
    type: problemType(problem.reason ?? problem.code),
    title: problem.title,
    status,
    detail: problem.detail,
    code: problem.code,
    reason: problem.reason,
  });
  res
    .writeHead(status, {
      ...headers,
      'Content-Type': 'application/problem+json; charset=utf-8',
      'Content-Length': Buffer.byteLength(body),
    })
    .end(body);
}
