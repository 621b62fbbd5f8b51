import type { ClusterBus } from '../cluster/bus.ts';
import type { Logger } from '../log.ts';

/** One open `subscriptions/listen` stream: whose it is, whether its credential still holds, how to end it. */
export interface OpenStream {
  agentId: string;
  /** Authenticates the stream's bearer token again: false once the agent is revoked or the token rotated. */
  stillValid(): Promise<boolean>;
  close(): void;
}

export interface StreamRegistry {
  /** Registers a stream, or refuses it (undefined) when its agent already holds the maximum here. */
  open(stream: OpenStream): (() => void) | undefined;
  /** How many streams the agent holds open on this replica. */
  count(agentId: string): number;
  close(): void;
}

/**
 * The listen streams open on this replica, by agent. An agent holds at most `max` of them here; and
 * whenever the cluster bus says an agent changed (on any replica: its revocation or token rotation
 * fires the trigger on `agents`), each of that agent's streams authenticates its token again and is
 * closed if it no longer holds. When changes may have been missed ('*'), every stream is checked.
 */
export function createStreamRegistry(max: number, bus: ClusterBus, log: Logger): StreamRegistry {
  const byAgent = new Map<string, Set<OpenStream>>();
  const recheck = (stream: OpenStream) => {
    stream
      .stillValid()
      .then((valid) => {
        if (valid) return;
        log.info({ agent_id: stream.agentId }, 'listen stream closed: its token no longer holds');
        stream.close();
      })
      // The database could not say: the stream stays until the next announcement settles it.
      .catch((err: unknown) => log.warn({ err }, 'could not check a listen stream'));
  };
  const unsubscribe = bus.onAgentChanged((agentId) => {
    const streams =
      agentId === '*' ? [...byAgent.values()].flatMap((s) => [...s]) : [...(byAgent.get(agentId) ?? [])];
    for (const stream of streams) recheck(stream);
  });
  return {
    open(stream) {
      const held = byAgent.get(stream.agentId) ?? new Set<OpenStream>();
      if (held.size >= max) return undefined;
      held.add(stream);
      byAgent.set(stream.agentId, held);
      return () => {
        held.delete(stream);
        if (held.size === 0 && byAgent.get(stream.agentId) === held) byAgent.delete(stream.agentId);
      };
    },
    count: (agentId) => byAgent.get(agentId)?.size ?? 0,
    close: () => void unsubscribe(),
  };
}
