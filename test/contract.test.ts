import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { connectHttp, startTestServer, type TestServer } from './helpers/server.ts';

const SNAPSHOT = new URL('./__snapshots__/tools-list.json', import.meta.url);

/**
 * The public contract — tool names, schemas and annotations — is snapshotted: any change shows up as a
 * reviewed diff. Regenerate with UPDATE_SNAPSHOTS=1 after a deliberate change.
 */
describe('the tools/list contract', () => {
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

  it('matches the reviewed snapshot', async () => {
    const { tools } = await client.listTools();
    const actual = JSON.stringify(tools, null, 2) + '\n';
    if (process.env.UPDATE_SNAPSHOTS === '1') fs.writeFileSync(SNAPSHOT, actual);
    assert.ok(fs.existsSync(SNAPSHOT), 'no snapshot yet: run with UPDATE_SNAPSHOTS=1');
    assert.deepEqual(JSON.parse(actual), JSON.parse(fs.readFileSync(SNAPSHOT, 'utf8')));
  });

  it('derives annotations from the kind: reads are read-only, writes are gated and idempotent', async () => {
    const { tools } = await client.listTools();
    const writes = ['isphere_send_message', 'isphere_send_file'];
    for (const tool of tools) {
      const isWrite = writes.includes(tool.name);
      const isInternal = tool.name === 'isphere_remember';
      assert.equal(tool.annotations?.readOnlyHint, !isWrite && !isInternal, tool.name);
      if (isInternal) assert.equal(tool.annotations?.openWorldHint, false);
      if (isWrite) {
        assert.equal(tool.annotations?.destructiveHint, false);
        assert.equal(tool.annotations?.idempotentHint, true);
        const props = tool.inputSchema.properties as Record<string, { default?: unknown }>;
        assert.equal(props.dry_run?.default, true, `${tool.name} defaults to dry_run`);
      }
      assert.equal(tool.inputSchema.type, 'object');
      const out = tool.outputSchema as { properties: Record<string, unknown>; required: string[] };
      for (const field of ['ok', 'status', 'next_cursor', 'audit']) {
        assert.ok(out.required.includes(field), `${tool.name}.${field}`);
      }
      assert.ok('error' in out.properties);
    }
  });
});
