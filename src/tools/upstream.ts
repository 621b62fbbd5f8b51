import type { Tool, JsonSchemaType } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { UpstreamToolMode } from '../config.ts';
import {
  errorText,
  type Upstream,
  type UpstreamTool,
  upstreamValidator,
  exposedName,
} from '../connectors/index.ts';
import type { Logger } from '../log.ts';
import { AppError } from '../core/errors.ts';
import type { AnyToolDef, ReadToolDef, WriteToolDef } from './types.ts';
import { writeControlParams, writeOutput, writeOutputFields } from './write/controls.ts';

/** MCP tool names: letters, digits, `_`, `-`, `.`; at most 128 characters. */
const TOOL_NAME = /^[A-Za-z0-9_.-]{1,128}$/;

/** The gate's controls, added to every gated upstream tool's input. */
const { source_preference: _unused, ...controls } = writeControlParams;
const CONTROL_NAMES = Object.keys(controls);

const UpstreamResult = z.object({
  content: z
    .array(z.record(z.string(), z.unknown()))
    .describe("The upstream tool's content blocks, as it sent them."),
  structured_content: z
    .record(z.string(), z.unknown())
    .nullable()
    .describe("The upstream tool's structured result, if it gave one."),
});

const readOutput = UpstreamResult;

const upstreamWriteOutput = z.object({
  ...writeOutputFields,
  call: z
    .object({
      upstream: z.string(),
      tool: z.string(),
      arguments: z.record(z.string(), z.unknown()),
      input_schema_sha256: z.string(),
    })
    .describe('Exactly the call that is made once approved; the approval is bound to it.'),
  result: UpstreamResult.nullable().describe('Once executed: what the upstream answered.'),
});

/** The gate's controls as JSON Schema, added to each gated tool's listed input schema. */
type JsonSchemaProperties = NonNullable<Tool['inputSchema']['properties']>;
const controlSchemas: JsonSchemaProperties = Object.fromEntries(
  Object.entries(controls).map(([k, schema]) => {
    const { $schema: _drop, ...json } = z.toJSONSchema(schema, { io: 'input' }) as Record<string, unknown>;
    return [k, json as JsonSchemaProperties[string]];
  }),
);

const titleOf = (t: Tool) => t.title ?? t.annotations?.title ?? t.name;

/**
 * Config wins; otherwise the tool's pinned class: what its first listing said (only `readOnlyHint: true`
 * makes a read), made more gated by later listings at once and less gated only by an operator's accept.
 */
export function modeOf(
  u: UpstreamTool,
  overrides: Readonly<Record<string, UpstreamToolMode>>,
): UpstreamToolMode {
  return overrides[u.tool.name] ?? u.pin.class;
}

function failed(upstream: Upstream, tool: string, text: string) {
  return new AppError(
    'CONNECTOR_FAILED',
    `upstream "${upstream.name}" tool "${tool}" failed: ${text}`,
    'upstream_error',
    { details: { upstream_text: text } },
  );
}

/** Calls the upstream tool; an `isError` answer becomes CONNECTOR_FAILED carrying the upstream's text. */
async function callThrough(
  upstream: Upstream,
  tool: string,
  args: Record<string, unknown>,
  signal: AbortSignal,
) {
  const result = await upstream.call(tool, args, signal);
  if (result.isError) throw failed(upstream, tool, errorText(result));
  return {
    content: result.content as Record<string, unknown>[],
    structured_content: (result.structuredContent as Record<string, unknown> | undefined) ?? null,
  };
}

/**
 * A zod input that takes any object and checks it against the upstream's JSON Schema (without the gate's
 * controls, which are the pipeline's own). Invalid arguments are refused before anything is drafted or sent.
 * Its patterns run on RE2 (see upstreamValidator): an upstream's schema cannot hold the event loop.
 */
function inputFor(schema: Tool['inputSchema'], gated: boolean) {
  // `$schema` only names a dialect; Ajv would try to resolve a 2020-12 URI as a reference and fail.
  const { $schema: _dialect, ...checked } = schema as Record<string, unknown>;
  const validate = upstreamValidator(checked as JsonSchemaType);
  return z.looseObject(gated ? controls : {}).superRefine((value, ctx) => {
    const args = gated ? withoutControls(value) : value;
    const result = validate(args);
    if (!result.valid) {
      // Ajv calls the value `data`; the agent knows it as its arguments.
      const message = result.errorMessage.replace(/(^|, )data\b/g, '$1arguments');
      ctx.addIssue({ code: 'custom', message, input: args });
    }
  });
}

function withoutControls(value: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(value).filter(([k]) => !CONTROL_NAMES.includes(k)));
}

function describe(upstream: Upstream, t: Tool, gated: boolean): string {
  const own = t.description?.trim() || `The "${t.name}" tool of ${upstream.name}.`;
  return gated
    ? `${own}\n\n[countersign: a gated write on upstream "${upstream.name}". dry_run (default true) returns the ` +
        'exact call and requests approval; once a chair approves, call again with the same arguments, ' +
        'dry_run=false and the approval_id.]'
    : `${own}\n\n[countersign: a read on upstream "${upstream.name}", passed through and audited.]`;
}

function readTool(
  upstream: Upstream,
  name: string,
  u: UpstreamTool,
): ReadToolDef<z.ZodObject, typeof readOutput> {
  const t = u.tool;
  return {
    name,
    title: titleOf(t),
    description: describe(upstream, t, false),
    facet: 'upstream_read',
    kind: 'read',
    input: inputFor(t.inputSchema, false) as unknown as z.ZodObject,
    output: readOutput,
    listing: {
      inputSchema: t.inputSchema,
      annotations: {
        title: titleOf(t),
        readOnlyHint: true,
        openWorldHint: t.annotations?.openWorldHint ?? true,
      },
    },
    async handler(args, ctx) {
      const data = await callThrough(upstream, t.name, args as Record<string, unknown>, ctx.signal);
      return {
        data,
        audit: { source: upstream.source, details: { upstream_tool: t.name } },
      };
    },
  };
}

function writeTool(
  upstream: Upstream,
  name: string,
  u: UpstreamTool,
): WriteToolDef<z.ZodObject, typeof upstreamWriteOutput> {
  const t = u.tool;
  return {
    name,
    title: titleOf(t),
    description: describe(upstream, t, true),
    facet: 'upstream_write',
    kind: 'write',
    input: inputFor(t.inputSchema, true) as unknown as z.ZodObject,
    output: upstreamWriteOutput,
    listing: {
      inputSchema: {
        ...t.inputSchema,
        type: 'object',
        properties: { ...t.inputSchema.properties, ...controlSchemas },
      },
      annotations: {
        title: titleOf(t),
        readOnlyHint: false,
        destructiveHint: t.annotations?.destructiveHint ?? true,
        idempotentHint: t.annotations?.idempotentHint ?? false,
        openWorldHint: t.annotations?.openWorldHint ?? true,
      },
    },
    async prepare(args, ctx) {
      const callArgs = withoutControls(args as Record<string, unknown>);
      // Refused before the approval is consumed: with the upstream down, nothing could be sent.
      if (args.dry_run === false) upstream.assertUp();
      const call = {
        upstream: upstream.name,
        tool: t.name,
        arguments: callArgs,
        input_schema_sha256: u.input_schema_sha256,
      };
      const target = {
        target_type: 'mcp_tool' as const,
        target_id: name,
        display_name: `${upstream.name} / ${t.name}`,
      };
      return {
        source: upstream.source,
        target,
        // The schema's hash is part of the bound content: a tool whose input schema changed after the dry
        // run no longer matches its approval.
        content: { arguments: callArgs, input_schema_sha256: u.input_schema_sha256 },
        review: { upstream_call: call },
        file_sha256: null,
        // No key reaches the upstream (MCP has none): the gate consumes the approval before this runs, once.
        perform: () => callThrough(upstream, t.name, callArgs, ctx.signal),
        present: (r) => ({
          ...writeOutput(r, target),
          call,
          result: (r.result as z.infer<typeof UpstreamResult> | null) ?? null,
        }),
      };
    },
  };
}

/**
 * The tools of one upstream as countersign exposes them: `<upstream>__<tool>`, reads passed through,
 * everything else gated, hidden ones left out. Tools that cannot be exposed safely are left out with a
 * logged reason, never exposed unchecked.
 */
export function upstreamToolDefs(
  upstream: Upstream,
  overrides: Readonly<Record<string, UpstreamToolMode>>,
  log: Logger,
): AnyToolDef[] {
  const defs: AnyToolDef[] = [];
  for (const u of upstream.tools().values()) {
    const mode = modeOf(u, overrides);
    if (mode === 'hidden') continue;
    const name = exposedName(upstream.name, u.tool.name);
    const skip = (reason: string) =>
      log.error({ upstream: upstream.name, tool: u.tool.name, reason }, 'upstream tool not exposed');
    if (!TOOL_NAME.test(name)) {
      skip(`"${name}" is not a valid MCP tool name`);
      continue;
    }
    const clash = CONTROL_NAMES.filter((c) => c in (u.tool.inputSchema.properties ?? {}));
    if (mode === 'write' && clash.length > 0) {
      skip(`its parameters ${clash.join(', ')} clash with the approval gate's own`);
      continue;
    }
    try {
      defs.push(mode === 'read' ? readTool(upstream, name, u) : writeTool(upstream, name, u));
    } catch (err) {
      skip(`its input schema cannot be compiled: ${(err as Error).message}`);
    }
  }
  return defs;
}
