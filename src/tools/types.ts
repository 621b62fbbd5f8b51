import type { Tool } from '@modelcontextprotocol/server';
import type { z } from 'zod';
import type { AuditFacts } from '../core/audit-kinds.ts';
import type { PreparedWrite, Approvals, TaskView } from '../approval/index.ts';
import type { Config } from '../config.ts';
import type { ConnectorSet, BlobStore } from '../connectors/index.ts';
import type { Agent } from '../core/identity.ts';
import type { Facet } from '../core/schemas.ts';
export type { PreparedWrite, WriteResult } from '../approval/index.ts';
import type { MemoryStore } from './memory/store.ts';
import type { CursorCodec } from './cursor.ts';

/** What every handler knows of its call. Tools never reach the database or the raw MCP server directly. */
interface CallContext {
  agent: Agent;
  request_id: string;
  trace_id: string;
  signal: AbortSignal;
}

/** A read tool's reach: the connectors' reads, and the calling agent's own approval requests (never a decision). */
export interface ReadContext extends CallContext {
  connectors: ConnectorSet;
  cursors: CursorCodec;
  config: Config;
  blobs: BlobStore;
  approvals: Pick<Approvals, 'getOwn' | 'listOwn'>;
}

/** A memory tool's reach: the notes countersign keeps for the calling agent, nothing else. */
export interface MemoryContext extends CallContext {
  memory: MemoryStore;
}

/** A write tool's reach while preparing: it resolves and checks; the approval gate decides and performs. */
export interface WriteContext extends CallContext {
  connectors: ConnectorSet;
  config: Config;
  blobs: BlobStore;
}

/** What a handler returns besides its own fields: the audit facts the pipeline records. */
export interface ToolOutcome<T> {
  data: T;
  /** `empty` when a read found nothing. */
  empty?: boolean;
  next_cursor?: string | null;
  audit?: AuditFacts;
  /** A write asked for as an MCP task: the task, answered instead of the envelope (approval/gate.ts). */
  task?: TaskView;
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
  kind: 'read';
  facet: Exclude<Facet, 'memory'>;
  handler(args: z.output<I>, ctx: ReadContext): Promise<ToolOutcome<z.output<O>>>;
}

/** remember (internal: changes only countersign's own state) and recall (read). */
export interface MemoryToolDef<
  I extends z.ZodObject = z.ZodObject,
  O extends z.ZodObject = z.ZodObject,
> extends ToolBase<I, O> {
  kind: 'read' | 'internal';
  facet: 'memory';
  handler(args: z.output<I>, ctx: MemoryContext): Promise<ToolOutcome<z.output<O>>>;
}

/** A write tool never writes by itself: the approval gate in src/approval/gate.ts decides. */
export interface WriteToolDef<
  I extends z.ZodObject = z.ZodObject,
  O extends z.ZodObject = z.ZodObject,
> extends ToolBase<I, O> {
  kind: 'write';
  prepare(args: z.output<I>, ctx: WriteContext): Promise<PreparedWrite<z.output<O>>>;
}

/** Erases a definition's parameter types so the registry can hold them all. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- handlers are typed at their definition; the registry only passes validated args through
export type AnyToolDef = ReadToolDef<any, any> | MemoryToolDef<any, any> | WriteToolDef<any, any>;
