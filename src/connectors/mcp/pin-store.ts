import type { Queryable, Transaction } from '../../db/knex.ts';
import { z } from 'zod';

/*
 * The table of upstream tool pins: every statement on it. pins.ts decides what a listing changes and
 * pin-accept.ts what an operator's accept does; both hand their transaction to these.
 */

export const PINS = 'upstream_tool_pins';

export const ToolClass = z.enum(['read', 'write']);
export type ToolClass = z.infer<typeof ToolClass>;

/** The annotations a class follows from; the rest (title) is cosmetic and not pinned. */
export const Hints = z.object({
  readOnlyHint: z.boolean().optional(),
  destructiveHint: z.boolean().optional(),
  idempotentHint: z.boolean().optional(),
  openWorldHint: z.boolean().optional(),
});
export type Hints = z.infer<typeof Hints>;
/** What one listing says of one tool. */
export interface Listed {
  class: ToolClass;
  annotations: Hints;
  input_schema_sha256: string;
}

const when = z.union([z.date(), z.string()]).transform((v) => new Date(v).toISOString());

/** One row of upstream_tool_pins, parsed at the boundary. */
export const PinRow = z.object({
  upstream: z.string(),
  tool: z.string(),
  class: ToolClass,
  annotations: Hints,
  input_schema_sha256: z.string(),
  pinned_at: when,
  accepted_by: z.string().nullable(),
  revision: z.number().int(),
  pending_class: ToolClass.nullable(),
  pending_annotations: Hints.nullable(),
  pending_input_schema_sha256: z.string().nullable(),
  pending_since: when.nullable(),
});
export type PinRow = z.infer<typeof PinRow>;

/** Pins in name order: all, one upstream's, or one tool's; `lock` takes their row locks (in a transaction). */
export async function readPins(
  q: Queryable,
  upstream?: string,
  tool?: string,
  opts: { lock?: boolean } = {},
) {
  const query = q(PINS).orderBy(['upstream', 'tool']);
  if (upstream !== undefined) query.where({ upstream });
  if (tool !== undefined) query.where({ tool });
  if (opts.lock) query.forUpdate();
  return ((await query) as unknown[]).map((r) => PinRow.parse(r));
}

/** Whether any tool of `upstream` was ever listed. */
export async function upstreamKnown(q: Queryable, upstream: string): Promise<boolean> {
  return (await q(PINS).where({ upstream }).first()) !== undefined;
}

/** Pins the tools first seen; returns those this insert made (another replica may have made the rest). */
export async function insertPins(
  trx: Transaction,
  upstream: string,
  fresh: [string, Listed][],
): Promise<PinRow[]> {
  return (
    (await trx(PINS)
      .insert(
        fresh.map(([tool, l]) => ({
          upstream,
          tool,
          class: l.class,
          annotations: JSON.stringify(l.annotations),
          input_schema_sha256: l.input_schema_sha256,
        })),
      )
      .onConflict(['upstream', 'tool'])
      .ignore()
      .returning('*')) as unknown[]
  ).map((r) => PinRow.parse(r));
}

/** `set` on the pin, if it is still at the revision read (one replica records each change). */
async function changePin(trx: Transaction, pin: PinRow, set: Record<string, unknown>) {
  const [updated] = (await trx(PINS)
    .where({ upstream: pin.upstream, tool: pin.tool, revision: pin.revision })
    .update({ ...set, revision: pin.revision + 1 })
    .returning('*')) as unknown[];
  return updated ? PinRow.parse(updated) : undefined;
}

/** A listing toward less gating, held pending beside the pin; undefined when another replica got there first. */
export const holdListed = (trx: Transaction, pin: PinRow, listed: Listed) =>
  changePin(trx, pin, {
    pending_class: listed.class,
    pending_annotations: JSON.stringify(listed.annotations),
    pending_input_schema_sha256: listed.input_schema_sha256,
    pending_since: trx.fn.now(),
  });

/** A listing pinned at once (any held change withdrawn); undefined when another replica got there first. */
export const pinListed = (trx: Transaction, pin: PinRow, listed: Listed) =>
  changePin(trx, pin, {
    class: listed.class,
    annotations: JSON.stringify(listed.annotations),
    input_schema_sha256: listed.input_schema_sha256,
    pinned_at: trx.fn.now(),
    accepted_by: null,
    pending_class: null,
    pending_annotations: null,
    pending_input_schema_sha256: null,
    pending_since: null,
  });

/** The held change of a (locked) pin made its pin, accepted by `actor`. */
export async function acceptHeld(trx: Transaction, row: PinRow, actor: string): Promise<void> {
  await trx(PINS)
    .where({ upstream: row.upstream, tool: row.tool })
    .update({
      class: row.pending_class,
      annotations: JSON.stringify(row.pending_annotations ?? {}),
      input_schema_sha256: row.pending_input_schema_sha256,
      pinned_at: trx.fn.now(),
      accepted_by: actor,
      revision: row.revision + 1,
      pending_class: null,
      pending_annotations: null,
      pending_input_schema_sha256: null,
      pending_since: null,
    });
}
