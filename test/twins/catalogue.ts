import type { AppError } from '../../src/core/errors.ts';
import type { Profile } from '../../src/core/profiles.ts';
import type { Upstream } from '../../src/connectors/index.ts';
import { createCatalogue, type Catalogue, type Entry } from '../../src/server/catalogue.ts';
import type { AnyToolDef } from '../../src/tools/index.ts';
import { createLogger } from '../../src/log.ts';
import type { Config } from '../../src/config.ts';

/** What a test can do to the catalogue twin: take an upstream down, change the tools on offer. */
export interface TwinCatalogue extends Catalogue {
  /** Tools named `<upstream>__…` answer as an upstream that is down, with `unavailable`, until `up`. */
  down(upstream: string, unavailable: () => AppError): void;
  up(upstream: string): void;
  /** Replaces the tools on offer and tells the listeners, as an upstream's new listing does. */
  offer(tools: readonly AnyToolDef[]): void;
}

/**
 * The catalogue's twin: built-ins under the prefix, as the real catalogue (server/catalogue.ts) lists
 * them — it is rebuilt with the real one for each offer, since the listing (schemas, annotations) is
 * what the seam's clients see — plus upstreams a test takes down by name, without an MCP connection.
 * test/twins/contracts/catalogue.ts holds both to the same lookups and listings.
 */
export function twinCatalogue(tools: readonly AnyToolDef[], config: Config): TwinCatalogue {
  const log = createLogger('silent');
  let real = createCatalogue({ tools, upstreams: [], config, log });
  const downs = new Map<string, () => AppError>();
  const listeners = new Set<() => void>();
  return {
    lookup(name): Entry {
      const found = real.lookup(name);
      if (found.kind !== 'unknown') return found;
      const upstream = [...downs.keys()].find((u) => name.startsWith(`${u}__`));
      if (!upstream) return found;
      const unavailable = downs.get(upstream)!;
      return {
        kind: 'down',
        upstream: { name: upstream, source: `mcp:${upstream}`, unavailable } as Upstream,
      };
    },
    listFor: (profile: Profile | undefined) => real.listFor(profile),
    onChanged(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    down(upstream, unavailable) {
      downs.set(upstream, unavailable);
    },
    up(upstream) {
      downs.delete(upstream);
    },
    offer(next) {
      real = createCatalogue({ tools: next, upstreams: [], config, log });
      for (const listener of listeners) listener();
    },
  };
}
