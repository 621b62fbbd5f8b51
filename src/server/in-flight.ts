/**
 * How many requests of one agent this replica works on at once. An agent's request takes a slot once
 * its token is checked and before its body is read; past `max` it waits, in arrival order, for one of
 * the agent's own slots to free, its body unread (the client's upload waits on the socket). So one
 * agent sending many requests at once — a flood, each call refused and audited, or a busy client —
 * takes at most `max` turns of the server's CPU at a time, and another agent's call waits behind at
 * most that many of them, not behind the whole flood. Every request is still answered and audited, in
 * turn. Past `maxWaiting` requests waiting, the next is refused at once (the caller answers 429).
 */
export interface InFlight {
  /**
   * A slot for `agentId`: resolves its release once the request may go on (at once while the agent
   * has fewer than `max` in flight), or undefined when `maxWaiting` of its requests already wait.
   * `gone` gives the request's end, asked only of a request that waits: a request that ends while it
   * waits gives up its place.
   */
  enter(agentId: string, gone: () => Promise<void>): Promise<(() => void) | undefined>;
  /** Requests of the agent in flight and waiting on this replica. */
  count(agentId: string): { active: number; waiting: number };
}

interface AgentSlots {
  active: number;
  waiting: (() => void)[];
}

export function createInFlight(max: number, maxWaiting: number): InFlight {
  const agents = new Map<string, AgentSlots>();

  const releaser = (agentId: string, slots: AgentSlots) => {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = slots.waiting.shift();
      // The slot passes straight to the next waiting request: no other request can jump the queue.
      if (next) return next();
      slots.active--;
      if (slots.active === 0 && agents.get(agentId) === slots) agents.delete(agentId);
    };
  };

  return {
    enter(agentId, gone) {
      let slots = agents.get(agentId);
      if (!slots) {
        slots = { active: 0, waiting: [] };
        agents.set(agentId, slots);
      }
      if (slots.active < max) {
        slots.active++;
        return Promise.resolve(releaser(agentId, slots));
      }
      if (slots.waiting.length >= maxWaiting) return Promise.resolve(undefined);
      const held = slots;
      return new Promise((resolve) => {
        let ended = false;
        const turn = () => {
          const release = releaser(agentId, held);
          // Its client left while it waited: the slot goes on to the next.
          if (ended) return release();
          resolve(release);
        };
        held.waiting.push(turn);
        void gone().then(() => {
          ended = true;
          const i = held.waiting.indexOf(turn);
          if (i === -1) return;
          held.waiting.splice(i, 1);
          resolve(undefined);
        });
      });
    },
    count(agentId) {
      const slots = agents.get(agentId);
      return { active: slots?.active ?? 0, waiting: slots?.waiting.length ?? 0 };
    },
  };
}
