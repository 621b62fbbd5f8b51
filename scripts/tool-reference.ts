/**
 * npm run docs:tools — writes docs/tools.md, the reference of every built-in tool's arguments and
 * outputs, from the tools' own zod schemas (the same ones tools/list advertises).
 * test/unit/tool-reference.test.ts fails when the file is not what this would write now.
 */
import fs from 'node:fs';
import path from 'node:path';
import prettier from 'prettier';
import { z } from 'zod';
import { builtinTools } from '../src/tools/index.ts';
import { oneRequired } from '../src/tools/params.ts';
import type { AnyToolDef } from '../src/tools/types.ts';

export const REFERENCE_FILE = path.resolve(import.meta.dirname, '../docs/tools.md');
/** The default prefix of the built-in tools' names (config `tools.prefix`). */
const PREFIX = 'isphere_';

interface JsonSchema {
  type?: string | string[];
  description?: string;
  default?: unknown;
  enum?: unknown[];
  const?: unknown;
  items?: JsonSchema;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  anyOf?: JsonSchema[];
  oneOf?: JsonSchema[];
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  pattern?: string;
  format?: string;
}

const schemaOf = (schema: z.ZodType, io: 'input' | 'output') =>
  z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as JsonSchema;

/** A schema's type in a few words: `string ≤ 256`, `integer 1–100`, `"a" | "b"`, `array of object`. */
function typeOf(s: JsonSchema): string {
  if (s.const !== undefined) return JSON.stringify(s.const);
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(' \\| ');
  const union = s.anyOf ?? s.oneOf;
  if (union) return union.map(typeOf).join(' or ');
  const type = Array.isArray(s.type) ? s.type.join(' or ') : (s.type ?? 'any');
  if (type === 'array') return `array of ${s.items ? typeOf(s.items) : 'any'}`;
  const bounds: string[] = [];
  if (s.minLength !== undefined && s.minLength > 0) bounds.push(`≥ ${s.minLength} chars`);
  if (s.maxLength !== undefined) bounds.push(`≤ ${s.maxLength} chars`);
  // The safe integers' bounds are zod's way of saying "no minimum" and "no maximum" for an integer.
  const min = s.minimum === Number.MIN_SAFE_INTEGER ? undefined : s.minimum;
  const max = s.maximum === Number.MAX_SAFE_INTEGER ? undefined : s.maximum;
  if (min !== undefined && max !== undefined) bounds.push(`${min}–${max}`);
  else if (min !== undefined) bounds.push(`≥ ${min}`);
  else if (max !== undefined) bounds.push(`≤ ${max}`);
  if (s.format) bounds.push(s.format);
  return bounds.length ? `${type} (${bounds.join(', ')})` : type;
}

/** Table cells hold no line breaks and no unescaped pipes. */
const cell = (text: string) => text.replace(/\s*\n\s*/g, ' ').replace(/(?<!\\)\|/g, '\\|');

/** `a` or `b`, as the required column says it. */
const either = (fields: readonly string[]) => fields.map((f) => `\`${f}\``).join(' or ');

function argumentRows(schema: JsonSchema, oneOf: readonly string[]): string[] {
  const required = new Set(schema.required ?? []);
  return Object.entries(schema.properties ?? {}).map(([name, p]) => {
    const given = required.has(name)
      ? 'yes'
      : oneOf.includes(name)
        ? `one of ${either(oneOf)}`
        : p.default !== undefined
          ? `no (${JSON.stringify(p.default)})`
          : 'no';
    return `| \`${name}\` | ${cell(typeOf(p))} | ${cell(given)} | ${cell(p.description ?? '')} |`;
  });
}

/** The output's fields, nested objects and arrays of objects spelled out as `a.b` and `a[].b`. */
function outputRows(schema: JsonSchema, prefix = ''): string[] {
  const required = new Set(schema.required ?? []);
  return Object.entries(schema.properties ?? {}).flatMap(([name, p]) => {
    const key = `${prefix}${name}`;
    const inner = p.anyOf?.find((s) => s.type !== 'null') ?? p;
    const row = `| \`${key}\` | ${cell(typeOf(p))}${required.has(name) ? '' : ' (optional)'} | ${cell(p.description ?? inner.description ?? '')} |`;
    if (inner.type === 'object' && inner.properties) return [row, ...outputRows(inner, `${key}.`)];
    if (inner.type === 'array' && inner.items?.type === 'object' && inner.items.properties)
      return [row, ...outputRows(inner.items, `${key}[].`)];
    return [row];
  });
}

function section(tool: AnyToolDef): string {
  const input = schemaOf(tool.input, 'input');
  const output = schemaOf(tool.output, 'output');
  const args = argumentRows(input, oneRequired.get(tool.input)?.fields ?? []);
  return [
    `## \`${PREFIX}${tool.name}\` — ${tool.title}`,
    '',
    tool.description,
    '',
    `Kind: ${tool.kind === 'write' ? 'write (dry run unless `dry_run: false` with an `approval_id`)' : 'read'}; facet \`${tool.facet}\`.`,
    '',
    '### Arguments',
    '',
    ...(args.length
      ? ['| argument | type | required (default) | meaning |', '| --- | --- | --- | --- |', ...args]
      : ['None.']),
    '',
    '### Output (beside the envelope)',
    '',
    '| field | type | meaning |',
    '| --- | --- | --- |',
    ...outputRows(output),
    '',
  ].join('\n');
}

/** docs/tools.md as it should read now, formatted as `npm run lint` wants it. */
export async function toolReference(): Promise<string> {
  const options = (await prettier.resolveConfig(REFERENCE_FILE)) ?? {};
  return prettier.format(markdown(), { ...options, parser: 'markdown' });
}

function markdown(): string {
  return [
    '# Tool reference',
    '',
    "<!-- Generated by `npm run docs:tools` from the tools' zod schemas; test/unit/tool-reference.test.ts fails when it is stale. -->",
    '',
    'Every built-in tool, as `tools/list` advertises it with the default prefix `isphere_`',
    '(config `tools.prefix`). Every answer is an envelope — `ok`, `status`, `source`, `trace_id`,',
    '`audit`, `error` on failure, `approval` on writes (README, "The response envelope") — with the fields',
    'below beside it. Arguments not listed are refused (`INVALID_ARGUMENT`, naming the argument); where',
    'the required column says "one of `a` or `b`", a call gives at least one of them.',
    "Upstream tools (`<upstream>__<tool>`) carry their own server's schemas (docs/upstreams.md). Their",
    'answer is the same envelope, with what the upstream answered inside it (`content` and',
    "`structured_content`), and the envelope's JSON again as the text content: SPEC §4 asks both of every",
    "tool's result, so neither copy of the upstream's content is left out (docs/upstreams.md, \"The",
    'answer\'s size").',
    '',
    ...builtinTools.map(section),
  ].join('\n');
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(import.meta.filename)) {
  fs.writeFileSync(REFERENCE_FILE, await toolReference());
  process.stderr.write(`wrote ${path.relative(process.cwd(), REFERENCE_FILE)}\n`);
}
