import { createHash, randomBytes, randomUUID } from 'node:crypto';
import canonicalize from 'canonicalize';
import {
  ErrorCode as RpcCode,
  McpError,
  type CallToolResult,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import type { Approvals } from '../approval/index.ts';
import { runWrite, type WriteControls } from '../approval/gate.ts';
import type { AuditLog } from '../audit/log.ts';
import type { Config } from '../config.ts';
import type { ConnectorSet } from '../connectors/index.ts';
import type { BlobStore } from '../connectors/local/blobs.ts';
import type { Logger } from '../log.ts';
import type { CursorCodec } from '../tools/cursor.ts';
import { envelopeSchema, type AuditBlock, type ErrorBlock } from '../tools/envelope.ts';
import { ToolError } from '../tools/errors.ts';
import type { AnyToolDef, ToolContext, ToolOutcome } from '../tools/types.ts';
import type { Agent } from './agents.ts';

export interface PipelineDeps {
  tools: readonly AnyToolDef[];
  audit: AuditLog;
  connectors: ConnectorSet;
  cursors: CursorCodec;
  approvals: Approvals;
  blobs: BlobStore;
  config: Config;
  log: Logger;
}

export interface CallPipeline {
  listTools(agent: Agent): Tool[];
  /** Runs one tools/call. Tool failures come back as `isError` results; protocol errors are thrown as McpError. */
  call(agent: Agent, name: string, args: unknown, signal: AbortSignal): Promise<CallToolResult>;
}

/** Annotations follow from a tool's kind, never set by hand (STYLE §3). */
function annotationsFor(tool: AnyToolDef): Tool['annotations'] {
  return tool.kind === 'read'
    ? { title: tool.title, readOnlyHint: true, openWorldHint: true }
    : {
        title: tool.title,
        readOnlyHint: false,
        destructiveHint: false,
        idempotentHint: true,
        openWorldHint: true,
      };
}

function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): Tool['inputSchema'] {
  const { $schema: _drop, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as Record<
    string,
    unknown
  >;
  return rest as Tool['inputSchema'];
}

function describeIssue(issue: z.core.$ZodIssue): string {
  const where = issue.path.length > 0 ? issue.path.join('.') : 'arguments';
  return `${where}: ${issue.message}`;
}

const newTraceId = () => randomBytes(16).toString('hex');

/**
 * The one seam every tool call passes through: (auth, done by the transport) → validate → handler →
 * envelope → audit. The audit row is committed before the response leaves; if it cannot be, the caller
 * gets an internal error instead of an unaudited result.
 */
export function createCallPipeline(deps: PipelineDeps): CallPipeline {
  const prefix = deps.config.tools.prefix;
  const byName = new Map(deps.tools.map((t) => [prefix + t.name, t]));
  const listing: Tool[] = deps.tools.map((t) => ({
    name: prefix + t.name,
    title: t.title,
    description: t.description,
    inputSchema: jsonSchema(t.input, 'input'),
    outputSchema: jsonSchema(envelopeSchema(t.output), 'output') as Tool['outputSchema'],
    annotations: annotationsFor(t),
  }));

  async function call(
    agent: Agent,
    name: string,
    args: unknown,
    signal: AbortSignal,
  ): Promise<CallToolResult> {
    const started = new Date();
    const request_id = randomUUID();
    const trace_id = newTraceId();
    const tool = byName.get(name);
    const argsSha256 = createHash('sha256')
      .update(canonicalize(args ?? {}) ?? '')
      .digest('hex');
    const base = { kind: 'tool.call' as const, request_id, trace_id, agent_id: agent.id, tool: name };

    if (!tool) {
      await deps.audit.append({
        ...base,
        result: 'error',
        error_code: 'UNKNOWN_TOOL',
        details: { args_sha256: argsSha256 },
      });
      throw new McpError(RpcCode.InvalidParams, `Unknown tool: ${name}`);
    }

    let outcome: ToolOutcome<Record<string, unknown>> | undefined;
    let failure: ToolError | undefined;
    try {
      const parsed = tool.input.safeParse(args ?? {});
      if (!parsed.success) {
        const first = parsed.error.issues[0]!;
        throw new ToolError('INVALID_ARGUMENT', describeIssue(first), 'invalid_argument', {
          details: { issues: parsed.error.issues.map(describeIssue) },
        });
      }
      const ctx: ToolContext = {
        agent,
        request_id,
        trace_id,
        connectors: deps.connectors,
        cursors: deps.cursors,
        config: deps.config,
        approvals: deps.approvals,
        blobs: deps.blobs,
        signal,
      };
      outcome =
        tool.kind === 'read'
          ? await tool.handler(parsed.data, ctx)
          : await runWrite(tool, parsed.data as WriteControls & Record<string, unknown>, ctx);
    } catch (err) {
      if (!(err instanceof ToolError)) {
        deps.log.error({ err, trace_id, tool: name, agent: agent.name }, 'tool handler crashed');
        await deps.audit.append({
          ...base,
          result: 'error',
          error_code: 'INTERNAL_ERROR',
          details: { args_sha256: argsSha256 },
        });
        throw new McpError(RpcCode.InternalError, `Internal error (trace_id ${trace_id})`, {
          code: 'INTERNAL',
          trace_id,
        });
      }
      failure = err;
    }

    const facts = outcome?.audit ?? {};
    const dryRun = facts.dry_run ?? false;
    const row = await deps.audit.append({
      ...base,
      source: facts.source ?? null,
      target_type: facts.target_type ?? null,
      target_ref: facts.target_ref ?? null,
      approval_id: facts.approval_id ?? null,
      dry_run: dryRun,
      content_sha256: facts.content_sha256 ?? null,
      file_sha256: facts.file_sha256 ?? null,
      result: failure ? 'error' : 'ok',
      error_code: failure?.code ?? null,
      details: {
        args_sha256: argsSha256,
        duration_ms: Date.now() - started.getTime(),
        ...(failure ? { reason: failure.reason ?? null } : {}),
        ...facts.details,
      },
    });

    const audit: AuditBlock = {
      tool: name,
      request_id,
      trace_id,
      source: facts.source ?? null,
      operator_id: agent.id,
      approval_id: facts.approval_id ?? null,
      dry_run: dryRun,
      target_ref: facts.target_ref ?? null,
      content_sha256: facts.content_sha256 ?? null,
      file_sha256: facts.file_sha256 ?? null,
      started_at: started.toISOString(),
      finished_at: new Date().toISOString(),
      result: failure ? 'error' : 'ok',
      audit_seq: row.seq,
    };

    let envelope: Record<string, unknown>;
    if (failure) {
      const error: ErrorBlock = {
        code: failure.code,
        message: failure.message,
        reason: failure.reason ?? null,
        trace_id,
        ...(failure.details ? { details: failure.details } : {}),
      };
      envelope = { ok: false, status: 'error', next_cursor: null, error, audit };
    } else {
      envelope = {
        ok: true,
        status: outcome!.empty ? 'empty' : 'ok',
        ...outcome!.data,
        next_cursor: outcome!.next_cursor ?? null,
        audit,
      };
    }
    return {
      structuredContent: envelope,
      content: [{ type: 'text', text: JSON.stringify(envelope) }],
      ...(failure ? { isError: true } : {}),
    };
  }

  return {
    listTools: () => listing,
    call,
  };
}
