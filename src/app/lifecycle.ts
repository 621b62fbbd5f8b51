import os from 'node:os';
import type { AuditInput } from '../audit/index.ts';
import type { Config } from '../config.ts';
import { configDigest } from './config-digest.ts';
import { VERSION } from '../core/version.ts';

/** How the server speaks MCP. */
export type Transport = 'http' | 'stdio';

/** Why a server stopped: a signal (SIGINT, SIGTERM), its stdio client closing stdin, or an error. */
export type StopReason = 'signal' | 'stdin_closed' | 'error';

/** Who starts and stops a server, in its audit rows: the OS user and the host. */
export function osActor(): string {
  let user: string;
  try {
    user = os.userInfo().username;
  } catch {
    user = `uid ${process.getuid?.() ?? '?'}`; // a uid without a passwd entry (some containers)
  }
  return `${user}@${os.hostname()}`;
}

export interface StartFacts {
  config: Config;
  transport: Transport;
  dialect: string;
  /** The audit signing key's id (SHA-256 of its public key, 16 hex characters). */
  signingKeyId: string;
  /** Where this process serves the web form, if it does. */
  web: string | null;
}

/** The server.started row: which version, set up how (config digest), signing with which key, where. */
export function startedRow(facts: StartFacts): AuditInput {
  return {
    kind: 'server.started',
    actor: osActor(),
    result: 'ok',
    details: {
      version: VERSION,
      config_sha256: configDigest(facts.config),
      signing_key_id: facts.signingKeyId,
      transport: facts.transport,
      database: facts.dialect,
      host: os.hostname(),
      pid: process.pid,
      web: facts.web,
    },
  };
}

/** The server.stopped row; a process that dies without one (a crash, SIGKILL) leaves the chain valid. */
export function stoppedRow(reason: StopReason, startedAt: Date, transport: Transport): AuditInput {
  return {
    kind: 'server.stopped',
    actor: osActor(),
    result: reason === 'error' ? 'error' : 'ok',
    details: {
      reason,
      uptime_s: Math.round((Date.now() - startedAt.getTime()) / 1000),
      transport,
      host: os.hostname(),
      pid: process.pid,
    },
  };
}
