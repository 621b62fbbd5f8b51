import type { Tool } from '@modelcontextprotocol/server';
import type { z } from 'zod';
import type { Approvals } from '../approval/index.ts';
import type { ApprovalSummary, Target } from '../approval/view.ts';
import type { Config } from '../config.ts';
import type { ConnectorSet } from '../connectors/index.ts';
import type { BlobStore } from '../connectors/local/blobs.ts';
import type { Agent } from '../server/agents.ts';
import type { MemoryStore } from '../server/memory.ts';
import type { CursorCodec } from './cursor.ts';

/** Every tool belongs to exactly one facet; profiles allow or deny facets. */
export type Facet =
  'directory' | 'messages' | 'files' | 'send' | 'approvals' | 'memory' | 'upstream_read' | 'upstream_write';
/** read: no side effect; internal: changes only countersign's own state (no approval); write: gated. */
export type ToolKind = 'read' | 'internal' | 'write';

/** What a handler may use. Tools never reach the database or the raw MCP server directly. */
export interface ToolContext {
  agent: Agent;
  request_id: string;
  trace_id: string;
  connectors: ConnectorSet;
  cursors: CursorCodec;
  config: Config;
  approvals: Approvals;
  blobs: BlobStore;
  memory: MemoryStore;
  /** The agent's profile allows this tool's writes in dry run only. */
  dryRunOnly: boolean;
  signal: AbortSignal;
}

/** What a handler returns besides its own fields: the audit facts the pipeline records. */
export interface ToolOutcome<T> {
  data: T;
  /** `empty` when a read found nothing. */
  empty?: boolean;
  next_cursor?: string | null;
  audit?: {
    source?: string;
    target_type?: string | null;
    target_ref?: string | null;
    dry_run?: boolean;
    content_sha256?: string | null;
    file_sha256?: string | null;
    approval_id?: string | null;
    details?: Record<string, unknown>;
  };
}

interface ToolBase<I extends z.ZodObject, O extends z.ZodObject> {
  /** Name without the configurable prefix, e.g. `search_contacts`. */
  name: string;
  title: string;
  description: string;
  facet: Facet;
  input: I;
  /** The tool's own output fields; the envelope is added around them. */
  output: O;
  /**
   * Set on tools re-exposed from an upstream MCP server: listed under `name` as is (no prefix), with the
   * upstream's JSON Schema (plus the gate's controls) instead of one derived from `input`.
   */
  listing?: { inputSchema: Tool['inputSchema']; annotations: Tool['annotations'] };
}

export interface ReadToolDef<
  I extends z.ZodObject = z.ZodObject,
  O extends z.ZodObject = z.ZodObject,
> extends ToolBase<I, O> {
  kind: 'read' | 'internal';
  handler(args: z.output<I>, ctx: ToolContext): Promise<ToolOutcome<z.output<O>>>;
}

/** What the approval gate passes to a write tool's `present`, to shape the tool's output. */
export interface WriteResult {
  dry_run: boolean;
  send_status: 'planned' | 'sent' | 'rejected';
  content_sha256: string;
  /** The connector's references once written (message_ref, file_ref …). */
  result: Record<string, unknown> | null;
  approval: z.infer<typeof ApprovalSummary> | null;
}

/** A write, resolved and checked but not performed: what the gate hashes, shows the chair, and runs. */
export interface PreparedWrite<T> {
  /** The connector's `source` (local, bridge, mcp:<name>). */
  source: string;
  target: Target;
  /** The exact write; hashed with the tool and target into content_sha256. */
  content: Record<string, unknown>;
  /** What the chair reviews. */
  review: Record<string, unknown>;
  file_sha256: string | null;
  /** Performs the write exactly once per key (the approval_id). */
  perform(key: string): Promise<Record<string, unknown>>;
  present(r: WriteResult): T;
}

/** A write tool never writes by itself: the approval gate in src/approval/gate.ts decides. */
export interface WriteToolDef<
  I extends z.ZodObject = z.ZodObject,
  O extends z.ZodObject = z.ZodObject,
> extends ToolBase<I, O> {
  kind: 'write';
  prepare(args: z.output<I>, ctx: ToolContext): Promise<PreparedWrite<z.output<O>>>;
}

export type ToolDef<I extends z.ZodObject = z.ZodObject, O extends z.ZodObject = z.ZodObject> =
  ReadToolDef<I, O> | WriteToolDef<I, O>;

/** Erases a definition's parameter types so the registry can hold them all. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- handlers are typed at their definition; the registry only passes validated args through
export type AnyToolDef = ReadToolDef<any, any> | WriteToolDef<any, any>;
