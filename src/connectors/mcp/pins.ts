import type { Connection, Transaction } from '../../db/knex.ts';
import type { AuditInput, AuditLog } from '../../audit/index.ts';
import type { Logger } from '../../log.ts';
import {
  Hints,
  holdListed,
  insertPins,
  pinListed,
  readPins,
  type Listed,
  type PinRow,
  type ToolClass,
} from './pin-store.ts';

export { Hints, PinRow, ToolClass, type Listed } from './pin-store.ts';

/**
 * Pinned classes of upstream tools (docs/upstreams.md). A tool's class is what its first listing
 * said; a later listing can make it more gated at once, never less: that change is held until an operator
 * accepts it (`countersign upstream accept`). Pins live in the database so that every replica applies the
 * same one, and every change to them is in the audit chain.
 */

const HINT_KEYS = Object.keys(Hints.shape) as (keyof Hints)[];

/** The boolean hints of whatever an upstream sent as annotations (anything else is dropped). */
export function hintsOf(annotations: unknown): Hints {
  const source = (annotations ?? {}) as Record<string, unknown>;
  return Object.fromEntries(
    HINT_KEYS.filter((k) => typeof source[k] === 'boolean').map((k) => [k, source[k]]),
  ) as Hints;
}

/** Only `readOnlyHint: true` from an upstream whose annotations are trusted makes a read. */
export const classOf = (hints: Hints, trustAnnotations: boolean): ToolClass =>
  trustAnnotations && hints.readOnlyHint === true ? 'read' : 'write';

/** How gated a class is: a change to a lower rank is held back. */
const RANK = { read: 0, write: 1 } satisfies Record<ToolClass, number>;

/** How a tool is treated now: its pinned class, and a listed class held back from it, if any. */
export interface Pin {
  class: ToolClass;
  held: ToolClass | null;
}

const pinnedOf = (row: PinRow): Listed => ({
  class: row.class,
  annotations: row.annotations,
  input_schema_sha256: row.input_schema_sha256,
});

const pendingOf = (row: PinRow): Listed | null =>
  row.pending_class && row.pending_annotations && row.pending_input_schema_sha256
    ? {
        class: row.pending_class,
        annotations: row.pending_annotations,
        input_schema_sha256: row.pending_input_schema_sha256,
      }
    : null;

const same = (a: Listed, b: Listed) =>
  a.class === b.class &&
  a.input_schema_sha256 === b.input_schema_sha256 &&
  HINT_KEYS.every((k) => a.annotations[k] === b.annotations[k]);

/** `<upstream>__<tool>`: the name an upstream tool is exposed, audited and filtered by. */
export const exposedName = (upstream: string, tool: string) => `${upstream}__${tool}`;

/** The columns every pin audit row shares: the tool, its upstream as source and target. */
export const pinRowFacts = (upstream: string, tool: string) => ({
  tool: exposedName(upstream, tool),
  source: `mcp:${upstream}`,
  target_type: 'mcp_tool',
  target_ref: exposedName(upstream, tool),
  result: 'ok' as const,
});

/** What one pass over a listing did: the rows it recorded, and whether another replica got there first. */
interface Pass {
  rows: AuditInput[];
  changes: { tool: string; from: Listed; to: Listed; held: boolean }[];
  lost: boolean;
  pins: Map<string, PinRow>;
}

async function pinNew(trx: Transaction, upstream: string, fresh: [string, Listed][], pass: Pass) {
  if (fresh.length === 0) return;
  const inserted = await insertPins(trx, upstream, fresh);
  // Only the replica whose insert made the pin records it: one pin, one row, however many saw it first.
  if (inserted.length < fresh.length) pass.lost = true;
  for (const row of inserted) {
    pass.pins.set(row.tool, row);
    pass.rows.push({
      kind: 'upstream.tool_classified',
      actor: `upstream:${upstream}`,
      ...pinRowFacts(upstream, row.tool),
      details: {
        upstream,
        upstream_tool: row.tool,
        class: row.class,
        annotations: row.annotations,
        input_schema_sha256: row.input_schema_sha256,
      },
    });
  }
}

/**
 * A listing that differs from what is recorded: toward less gating it is held (pending), anything else
 * (more gating, a new input schema or other hints with the same class, the held change withdrawn) is
 * pinned at once. The update is conditional on the revision read, so one replica records each change.
 */
async function recordChange(trx: Transaction, upstream: string, pin: PinRow, listed: Listed, pass: Pass) {
  const recorded = pendingOf(pin) ?? pinnedOf(pin);
  if (same(listed, recorded)) return;
  const held = RANK[listed.class] < RANK[pin.class];
  const updated = held ? await holdListed(trx, pin, listed) : await pinListed(trx, pin, listed);
  if (!updated) {
    // Another replica changed it first; the next pass reads what it recorded.
    pass.pins.delete(pin.tool);
    pass.lost = true;
    return;
  }
  pass.pins.set(pin.tool, updated);
  pass.changes.push({ tool: pin.tool, from: recorded, to: listed, held });
  pass.rows.push({
    kind: 'upstream.classification_changed',
    actor: `upstream:${upstream}`,
    ...pinRowFacts(upstream, pin.tool),
    details: {
      upstream,
      upstream_tool: pin.tool,
      from: recorded,
      to: listed,
      pinned_class: held ? pin.class : listed.class,
      held,
    },
  });
}

async function reconcile(
  trx: Transaction,
  audit: AuditLog,
  upstream: string,
  listing: ReadonlyMap<string, Listed>,
): Promise<Pass> {
  const pass: Pass = { rows: [], changes: [], lost: false, pins: new Map() };
  for (const row of await readPins(trx, upstream)) pass.pins.set(row.tool, row);
  // In name order, so that replicas reconciling at once take row locks in the same order.
  const listed = [...listing.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const known = listed.filter(([tool]) => pass.pins.has(tool));
  await pinNew(
    trx,
    upstream,
    listed.filter(([tool]) => !pass.pins.has(tool)),
    pass,
  );
  for (const [tool, l] of known) await recordChange(trx, upstream, pass.pins.get(tool)!, l, pass);
  // Last, after every row lock: the chain's lock is held from here to the commit.
  if (pass.rows.length > 0) await audit.appendIn(trx, ...pass.rows);
  return pass;
}

export interface UpstreamPins {
  /**
   * Pins what is new in an upstream's listing, records what changed, and answers how each listed tool is
   * to be treated. Throws when the database cannot be reached (the listing is then not used).
   */
  classify(upstream: string, listing: ReadonlyMap<string, Listed>): Promise<Map<string, Pin>>;
}

/** Passes over a listing until no other replica raced this one (each pass sees what the others recorded). */
const MAX_PASSES = 4;

export function createUpstreamPins(deps: { knex: Connection; audit: AuditLog; log: Logger }): UpstreamPins {
  /** The held change this process last warned of, per tool: a warning once per change, not per listing. */
  const warned = new Map<string, string>();

  function warnHeld(upstream: string, row: PinRow) {
    const key = exposedName(upstream, row.tool);
    const pending = pendingOf(row);
    if (!pending) {
      warned.delete(key);
      return;
    }
    const signature = JSON.stringify(pending);
    if (warned.get(key) === signature) return;
    warned.set(key, signature);
    deps.log.warn(
      { upstream, tool: row.tool, pinned: row.class, listed: pending.class, since: row.pending_since },
      `upstream tool listed as less gated than its pin; it stays ${row.class} until an operator runs ` +
        `countersign upstream accept ${upstream} ${row.tool}`,
    );
  }

  return {
    async classify(upstream, listing) {
      let pass: Pass | undefined;
      for (let i = 0; i < MAX_PASSES && (!pass || pass.lost); i++) {
        pass = await deps.knex.transaction((trx) => reconcile(trx, deps.audit, upstream, listing));
        for (const c of pass.changes.filter((change) => !change.held)) {
          deps.log.warn(
            { upstream, tool: c.tool, from: c.from, to: c.to },
            'upstream tool classification changed; pinned anew',
          );
        }
      }
      const pins = new Map<string, Pin>();
      for (const tool of listing.keys()) {
        const row = pass!.pins.get(tool);
        // A pin another replica holds but this pass could not read back stays as gated as can be.
        if (!row) {
          pins.set(tool, { class: 'write', held: null });
          continue;
        }
        warnHeld(upstream, row);
        pins.set(tool, { class: row.class, held: row.pending_class });
      }
      return pins;
    },
  };
}
