import type { z } from 'zod';
import type { Config } from '../config.ts';
import type { ConnectorSet } from '../connectors/index.ts';
import type { CursorCodec } from './cursor.ts';

/** Every tool belongs to exactly one facet; profiles allow or deny facets. */
export type Facet = 'directory' | 'messages' | 'files' | 'send' | 'approvals' | 'memory';
export type ToolKind = 'read' | 'write';

/** What a handler may use. Tools never reach the database or the raw MCP server directly. */
export interface ToolContext {
  agent: { id: string; name: string };
  request_id: string;
  trace_id: string;
  connectors: ConnectorSet;
  cursors: CursorCodec;
  config: Config;
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

export interface ToolDef<I extends z.ZodObject = z.ZodObject, O extends z.ZodObject = z.ZodObject> {
  /** Name without the configurable prefix, e.g. `search_contacts`. */
  name: string;
  title: string;
  description: string;
  facet: Facet;
  kind: ToolKind;
  input: I;
  /** The tool's own output fields; the envelope is added around them. */
  output: O;
  handler(args: z.output<I>, ctx: ToolContext): Promise<ToolOutcome<z.output<O>>>;
}

/** Erases a definition's parameter types so the registry can hold them all. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- handlers are typed at their definition; the registry only passes validated args through
export type AnyToolDef = ToolDef<any, any>;
