import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import fc from 'fast-check';
import { successSchema } from '../src/tools/envelope.ts';
import { builtinTools } from '../src/tools/index.ts';
import { connectHttp, startTestServer, type TestServer } from './helpers/server.ts';

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

    it(`${name} answers with an envelope or a protocol error`, async () => {
      await fc.assert(
        fc.asyncProperty(args, async (input) => {
          let result: CallToolResult;
          try {
            result = (await client.callTool({ name, arguments: input }, undefined, {
              timeout: 15_000,
            })) as CallToolResult;
          } catch (err) {
            assert.ok(err instanceof McpError, `not a protocol error: ${String(err)}`);
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
        }),
        { numRuns: 40 },
      );
    });
  }
});
