import type { Config, UpstreamToolMode } from '../config.ts';
import { unknownUpstream, type Accepted, type PinAdmin, type PinRow } from '../connectors/index.ts';

/** One pinned tool as `countersign upstream list` shows it. */
export interface PinView {
  upstream: string;
  tool: string;
  class: PinRow['class'];
  /** The config's mapping of the tool, which wins over the pin; null when it has none. */
  config: UpstreamToolMode | null;
  input_schema_sha256: string;
  pinned_at: string;
  accepted_by: string | null;
  /** A listing's less gated class, held until accepted. */
  pending: { class: PinRow['class']; input_schema_sha256: string; since: string | null } | null;
}

const viewOf = (row: PinRow, config: Config): PinView => ({
  upstream: row.upstream,
  tool: row.tool,
  class: row.class,
  config: config.upstreams.find((u) => u.name === row.upstream)?.tools[row.tool] ?? null,
  input_schema_sha256: row.input_schema_sha256,
  pinned_at: row.pinned_at,
  accepted_by: row.accepted_by,
  pending:
    row.pending_class && row.pending_input_schema_sha256
      ? {
          class: row.pending_class,
          input_schema_sha256: row.pending_input_schema_sha256,
          since: row.pending_since,
        }
      : null,
});

/** The pins of every upstream, or of one (NOT_FOUND when it has none). */
export async function listPins(pins: PinAdmin, config: Config, upstream?: string): Promise<PinView[]> {
  const rows = await pins.list(upstream);
  if (upstream !== undefined && rows.length === 0) throw unknownUpstream(upstream);
  return rows.map((r) => viewOf(r, config));
}

/**
 * Accepts the held classifications (PinAdmin.accept); `refresh`, when given, applies them in this
 * process before answering (the server behind the embedded database).
 */
export async function acceptPins(
  deps: { pins: PinAdmin; refresh?: () => Promise<void> },
  cmd: { upstream: string; tool?: string; actor: string },
): Promise<{ accepted: Accepted[] }> {
  const accepted = await deps.pins.accept(cmd);
  if (accepted.length > 0) await deps.refresh?.();
  return { accepted };
}
