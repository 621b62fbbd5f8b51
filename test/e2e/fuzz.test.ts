import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client, CallToolResult } from '@modelcontextprotocol/client';
import fc from 'fast-check';
import { z } from 'zod';
import { builtinTools } from '../../src/tools/index.ts';
import { successSchema } from '../helpers/checks.ts';
import { connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/** Values that tend to break things: wrong types, huge and odd strings, nesting. */
const nasty = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.string({ unit: 'binary', maxLength: 300 }),
  fc.constantFrom(
    '',
    ' ',
    '../../etc/passwd',
    '\u0000',
    '%',
    '_',
    '\\',
    "'; drop table audit_events; --",
    'x'.repeat(70_000),
  ),
  fc.integer(),
  fc.double(),
  fc.constantFrom(-1, 0, 1e308, Number.MAX_SAFE_INTEGER),
);

/** Ids and paths that exist in the demo data, or nearly: so that shaped input reaches the handlers. */
const plausible = fc.constantFrom(
  'ct_david',
  'ct_alice',
  'gr_board',
  'cv_alpha',
  'cv_david',
  'David',
  '../x',
  ' ',
);

interface PropertySchema {
  type?: string;
  enum?: unknown[];
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
}

/** Values a property's JSON schema accepts — at its bounds too — and now and then one it does not. */
function valueFor(schema: PropertySchema): fc.Arbitrary<unknown> {
  let valid: fc.Arbitrary<unknown>;
  if (schema.enum) valid = fc.constantFrom(...schema.enum);
  else if (schema.type === 'boolean') valid = fc.boolean();
  else if (schema.type === 'integer') {
    const min = schema.minimum ?? -1000;
    const max = Math.min(schema.maximum ?? 1000, min + 1_000_000);
    valid = fc.oneof(fc.integer({ min, max }), fc.constantFrom(min, max));
  } else if (schema.type === 'string') {
    const minLength = schema.minLength ?? 0;
    const maxLength = Math.min(schema.maxLength ?? 300, 300);
    valid = fc.oneof(
      fc.string({ unit: 'binary', minLength, maxLength }),
      plausible.filter((v) => v.length >= minLength),
      fc.constant('x'.repeat(schema.maxLength ?? 70_000)),
    );
  } else valid = fc.jsonValue({ maxDepth: 3 });
  return fc.oneof({ arbitrary: valid, weight: 5 }, { arbitrary: nasty, weight: 1 });
}

/** Arguments shaped by a tool's input schema: its own keys, mostly well-typed, required ones present. */
function shapedArgs(tool: (typeof builtinTools)[number]) {
  const schema = z.toJSONSchema(tool.input, { io: 'input', unrepresentable: 'any' }) as {
    properties?: Record<string, PropertySchema>;
    required?: string[];
  };
  const properties = Object.fromEntries(
    Object.entries(schema.properties ?? {}).map(([key, prop]) => [key, valueFor(prop)]),
  );
  return fc.record(properties, { requiredKeys: schema.required ?? [] });
}

/**
 * Failures this test found that are not fixed yet: reported as todo, so that the rest of the suite
 * stays a gate. Remove an entry once its fix lands.
 */
const KNOWN: Record<string, string> = {};

/**
 * Random arguments for every tool — its own parameter names with random values, plus random extra keys:
 * the answer is always a well-formed envelope (ok or error, with an audit block) or a protocol error,
 * never a crash, an unstructured error or a hang.
 */
describe('every tool, fed random input', () => {
  let server: TestServer;
  let client: Client;
  before(async () => {
    server = await startTestServer('pglite');
    client = await connectHttp(server.url, server.demoToken);
  });
  after(async () => {
    await client?.close();
    await server?.stop();
  });

  for (const tool of builtinTools) {
    const name = `isphere_${tool.name}`;
    const keys = Object.keys(tool.input.shape);
    const args = fc.dictionary(fc.oneof(fc.constantFrom(...keys), fc.string({ maxLength: 8 })), nasty, {
      maxKeys: keys.length + 2,
    });

    const answersWell = async (input: Record<string, unknown>) => {
      let result: CallToolResult;
      try {
        result = (await client.callTool(
          { name, arguments: input },
          {
            timeout: 15_000,
          },
        )) as CallToolResult;
      } catch (err) {
        assert.ok(err instanceof ProtocolError, `not a protocol error: ${String(err)}`);
        assert.notEqual(err.code, -32603, `internal error for ${JSON.stringify(input).slice(0, 300)}`);
        return;
      }
      const env = result.structuredContent as Record<string, unknown> & {
        error?: { code: string };
        audit: { audit_seq: number };
      };
      assert.equal(typeof env.ok, 'boolean');
      assert.ok(env.audit.audit_seq > 0);
      if (env.ok)
        assert.ok(successSchema(tool.output).safeParse(env).success, 'success matches the strict schema');
      else assert.ok(env.error && env.error.code !== 'INTERNAL_ERROR', JSON.stringify(env.error));
    };

    it(`${name} answers with an envelope or a protocol error`, async () => {
      await fc.assert(fc.asyncProperty(args, answersWell), { numRuns: 40 });
    });

    // Random values rarely get past validation; input shaped by the schema reaches the handler.
    it(
      `${name} answers input shaped by its schema with an envelope or a protocol error`,
      {
        todo: KNOWN[tool.name],
      },
      async () => {
        await fc.assert(fc.asyncProperty(shapedArgs(tool), answersWell), { numRuns: 40 });
      },
    );
  }
});
