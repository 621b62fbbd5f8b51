import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, it } from 'node:test';
import type { Client, Tool } from '@modelcontextprotocol/client';
import { connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const SNAPSHOTS = new URL('../__snapshots__/', import.meta.url);
/** The tool names in the order tools/list gives them. */
const NAMES = new URL('tool-names.json', SNAPSHOTS);
/** One file per tool: its whole tools/list entry, so a change shows up as a diff of that tool alone. */
const TOOLS = new URL('tools/', SNAPSHOTS);
const toolFile = (name: string) => new URL(`${name}.json`, TOOLS);
const asJson = (value: unknown) => JSON.stringify(value, null, 2) + '\n';
const readJson = (file: URL): unknown => JSON.parse(fs.readFileSync(file, 'utf8'));

/** Rewrites the snapshots from what the server lists now, dropping the files of tools no longer listed. */
function updateSnapshots(tools: Tool[]) {
  fs.mkdirSync(TOOLS, { recursive: true });
  fs.writeFileSync(NAMES, asJson(tools.map((t) => t.name)));
  for (const tool of tools) fs.writeFileSync(toolFile(tool.name), asJson(tool));
  for (const file of fs.readdirSync(TOOLS)) {
    if (!tools.some((t) => `${t.name}.json` === file)) fs.rmSync(new URL(file, TOOLS));
  }
}

/**
 * The public contract — tool names, schemas and annotations — is snapshotted: any change shows up as a
 * reviewed diff. Regenerate with UPDATE_SNAPSHOTS=1 after a deliberate change.
 */
describe('the tools/list contract', () => {
  let server: TestServer;
  let client: Client;
  let tools: Tool[];
  before(async () => {
    server = await startTestServer('pglite');
    client = await connectHttp(server.url, server.demoToken);
    tools = (await client.listTools()).tools;
    if (process.env.UPDATE_SNAPSHOTS === '1') updateSnapshots(tools);
  });
  after(async () => {
    await client?.close();
    await server?.stop();
  });

  it('lists the reviewed tools in the reviewed order, each with a snapshot and no snapshot left over', () => {
    assert.ok(fs.existsSync(NAMES), 'no snapshot yet: run with UPDATE_SNAPSHOTS=1');
    const names = readJson(NAMES) as string[];
    assert.deepEqual(
      tools.map((t) => t.name),
      names,
    );
    const files = fs.readdirSync(TOOLS).map((f) => f.replace(/\.json$/, ''));
    assert.deepEqual(files.sort(), [...names].sort());
  });

  it("matches each tool's reviewed snapshot", async (t) => {
    for (const tool of tools) {
      await t.test(tool.name, () => {
        assert.ok(
          fs.existsSync(toolFile(tool.name)),
          `no snapshot of ${tool.name}: run with UPDATE_SNAPSHOTS=1`,
        );
        assert.deepEqual(JSON.parse(asJson(tool)), readJson(toolFile(tool.name)));
      });
    }
  });

  it('derives annotations from the kind: reads are read-only, writes are gated and idempotent', () => {
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
