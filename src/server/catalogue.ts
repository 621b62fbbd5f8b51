import type { Tool } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { Config } from '../config.ts';
import type { Upstream } from '../connectors/index.ts';
import type { Logger } from '../log.ts';
import { envelopeSchema, upstreamToolDefs, type AnyToolDef } from '../tools/index.ts';
import type { Profile } from '../core/profiles.ts';

/** What a tool name stands for right now. */
export type Entry =
  | { kind: 'tool'; tool: AnyToolDef }
  /** A tool of an upstream that is not connected: it answers SOURCE_UNAVAILABLE until it is back. */
  | { kind: 'down'; upstream: Upstream }
  | { kind: 'unknown' };

/** The tools on offer: built-ins under the configured prefix, then each upstream's, relisted as they change. */
export interface Catalogue {
  lookup(name: string): Entry;
  /** The listing an agent with this profile sees, in catalogue order. */
  listFor(profile: Profile | undefined): Tool[];
  /** Calls `listener` whenever the list changed (an upstream's tools); returns the unsubscribe. */
  onChanged(listener: () => void): () => void;
}

interface Snapshot {
  byName: Map<string, AnyToolDef>;
  listing: Map<string, Tool>;
}

export function createCatalogue(deps: {
  tools: readonly AnyToolDef[];
  upstreams: readonly Upstream[];
  config: Config;
  log: Logger;
}): Catalogue {
  const prefix = deps.config.tools.prefix;
  const builtins = deps.tools.map((t) => ({
    name: prefix + t.name,
    tool: t,
    listing: listingOf(t, prefix + t.name),
  }));

  /** Built-ins first, then each upstream's tools; an upstream tool never shadows a built-in. */
  function snapshot(): Snapshot {
    const byName = new Map(builtins.map((b) => [b.name, b.tool]));
    const listing = new Map(builtins.map((b) => [b.name, b.listing]));
    for (const upstream of deps.upstreams) {
      const overrides = deps.config.upstreams.find((u) => u.name === upstream.name)?.tools ?? {};
      for (const def of upstreamToolDefs(upstream, overrides, deps.log)) {
        if (byName.has(def.name)) {
          deps.log.error({ tool: def.name }, 'upstream tool not exposed: a built-in tool has its name');
          continue;
        }
        byName.set(def.name, def);
        listing.set(def.name, listingOf(def, def.name));
      }
    }
    return { byName, listing };
  }

  let current = snapshot();
  const listeners = new Set<() => void>();
  for (const upstream of deps.upstreams) {
    upstream.onToolsChanged(() => {
      current = snapshot();
      for (const listener of listeners) listener();
    });
  }

  return {
    lookup(name) {
      const tool = current.byName.get(name);
      if (tool) return { kind: 'tool', tool };
      const down = deps.upstreams.find((u) => name.startsWith(`${u.name}__`) && u.status().state !== 'up');
      return down ? { kind: 'down', upstream: down } : { kind: 'unknown' };
    },
    listFor(profile) {
      return [...current.byName.entries()]
        .filter(([, t]) => profile?.allowed.has(t.facet))
        .map(([n]) => current.listing.get(n)!);
    },
    onChanged(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
}

/** Annotations follow from a tool's kind, never set by hand (docs/design.md, "Floors"). */
function annotationsFor(tool: AnyToolDef): Tool['annotations'] {
  switch (tool.kind) {
    case 'read':
      return { title: tool.title, readOnlyHint: true, openWorldHint: true };
    case 'internal':
      return {
        title: tool.title,
        readOnlyHint: false,
        destructiveHint: false,
        idempotentHint: true,
        openWorldHint: false,
      };
    case 'write':
      return {
        title: tool.title,
        readOnlyHint: false,
        destructiveHint: false,
        idempotentHint: true,
        openWorldHint: true,
      };
  }
}

function listingOf(tool: AnyToolDef, exposed: string): Tool {
  return {
    name: exposed,
    title: tool.title,
    description: tool.description,
    inputSchema: tool.listing?.inputSchema ?? jsonSchema(tool.input, 'input'),
    outputSchema: jsonSchema(envelopeSchema(tool.output), 'output') as Tool['outputSchema'],
    annotations: tool.listing?.annotations ?? annotationsFor(tool),
    // A write may be asked for as a task (server/tasks.ts): it completes once a chair has decided.
    // 2025-11-25 lists the marker; 2026-07-28 has none per tool (the SDK leaves it out there).
    ...(tool.kind === 'write' ? { execution: { taskSupport: 'optional' as const } } : {}),
  };
}

function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): Tool['inputSchema'] {
  const { $schema: _drop, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as Record<
    string,
    unknown
  >;
  return rest as Tool['inputSchema'];
}
