import type { Refusals } from '../audit/index.ts';
import type { Agent } from '../core/identity.ts';

/** How a refused agent token came: the transport, and the source Refusals counts it under (`ip`). */
export interface DeniedAt {
  transport: 'http' | 'stdio';
  /** The client's address on HTTP; on stdio the process that serves the client (stdio.ts). */
  ip: string;
}

/**
 * The auth.denied row of a request refused for its agent token, one shape on every transport: the
 * reason, where it came from, and the agent when the token named one (revoked, or its record
 * tampered: TAMPERED). `extra` holds what only one transport knows (an OAuth token's `via`, `subject`).
 */
export function deniedRow(
  refused: { failure: string; agent?: Pick<Agent, 'id' | 'name'> },
  at: DeniedAt,
  extra: Record<string, string> = {},
): Parameters<Refusals['record']>[1] {
  const { failure: reason, agent } = refused;
  return {
    kind: 'auth.denied',
    agent_id: agent?.id ?? null,
    result: 'error',
    error_code: reason === 'agent_record_tampered' ? 'TAMPERED' : 'UNAUTHENTICATED',
    details: {
      reason,
      transport: at.transport,
      ip: at.ip,
      ...extra,
      ...(agent ? { agent_name: agent.name } : {}),
    },
  };
}
