import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import canonicalize from 'canonicalize';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client, CallToolResult } from '@modelcontextprotocol/client';
import { cutText, escapeText, unsafeText } from '../../src/core/safe-text.ts';
import { unescapeText } from '../helpers/checks.ts';
import { databaseKinds } from '../helpers/db.ts';
import { connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

/** A small seeded generator (mulberry32): the same strings on every run, so a failure replays. */
function random(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Pieces strings are made of: plain text, the two unstorable kinds, a pair, a backslash, an escape look-alike. */
const PIECES = ['a', 'é', '\0', '\uD800', '\uDC00', '\uD83D\uDE00', '\\', '\\u0000', ' '];

function stringOf(next: () => number, length = 1 + Math.floor(next() * 12)): string {
  let s = '';
  for (let i = 0; i < length; i++) s += PIECES[Math.floor(next() * PIECES.length)]!;
  return s;
}

describe('the reversible escape of text that cannot be stored', () => {
  it('gives back what it was given, and is always safe to store and hash', () => {
    const next = random(7);
    for (let i = 0; i < 2000; i++) {
      const s = stringOf(next, Math.floor(next() * 20));
      const escaped = escapeText(s);
      assert.equal(unescapeText(escaped), s);
      assert.equal(unsafeText(escaped), undefined);
      assert.doesNotThrow(() => canonicalize({ [escaped]: escaped }));
      if (!unsafeText(s)) assert.equal(escapeText(s).replaceAll('\\\\', '\\'), s);
    }
  });

  it('never cuts a surrogate pair in two', () => {
    const emoji = '\u{1F600}';
    assert.equal(cutText(`${'x'.repeat(199)}${emoji}`, 200), 'x'.repeat(199));
    assert.equal(cutText(`${'x'.repeat(198)}${emoji}y`, 200), `${'x'.repeat(198)}${emoji}`);
    assert.equal(unsafeText(cutText(emoji.repeat(300), 200)), undefined);
  });
});

const rowDetails = (row: { details: unknown }) =>
  (typeof row.details === 'string' ? JSON.parse(row.details) : row.details) as Record<string, unknown>;

for (const kind of databaseKinds()) {
  describe(`calls whose input cannot be stored as given, on ${kind}`, () => {
    let server: TestServer;
    let client: Client;

    before(async () => {
      server = await startTestServer(kind);
      client = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await client?.close();
      await server?.stop();
    });

    const headSeq = async () =>
      Number(((await server.sql('audit_events').max({ m: 'seq' }).first()) as { m: unknown }).m);

    /** The call's answer: the envelope, or the JSON-RPC error's code and data. */
    async function answer(name: string, args: Record<string, unknown>) {
      try {
        const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
        return { envelope: result.structuredContent as Envelope };
      } catch (err) {
        assert.ok(err instanceof ProtocolError, String(err));
        return { rpc: err.code, data: err.data as Record<string, unknown> };
      }
    }

    it('refuses a lone surrogate in an argument INVALID_ARGUMENT naming the field, its row holding the escape', async () => {
      const bad = `caf\u00e9 \uD83D and \\u0000`;
      const { envelope } = await answer('isphere_search_contacts', { query: bad });
      assert.equal(envelope?.error?.code, 'INVALID_ARGUMENT');
      assert.equal(envelope.error.reason, 'lone_surrogate');
      assert.equal(envelope.error.details.field, 'query');
      const row = await server.sql('audit_events').where({ seq: envelope.audit.audit_seq }).first();
      assert.equal(row.kind, 'tool.call');
      assert.equal(row.error_code, 'INVALID_ARGUMENT');
      const recorded = rowDetails(row).invalid_argument as Record<string, unknown>;
      assert.equal(recorded.field, 'query');
      assert.equal(recorded.problem, 'lone_surrogate');
      assert.equal(unescapeText(String(recorded.value_escaped)), bad);
    });

    it('refuses a NUL in a key of the arguments the same way', async () => {
      const { envelope } = await answer('isphere_remember', {
        session_id: 's',
        key: 'k',
        value: 'v',
        ['x\0']: 1,
      });
      assert.equal(envelope?.error?.code, 'INVALID_ARGUMENT');
      assert.equal(envelope.error.reason, 'nul_byte');
      assert.equal(envelope.error.details.field, 'x\\u0000');
      const row = await server.sql('audit_events').where({ seq: envelope.audit.audit_seq }).first();
      const recorded = rowDetails(row).invalid_argument as Record<string, unknown>;
      assert.equal(unescapeText(String(recorded.value_escaped)), 'x\0');
    });

    it('keeps a long value by its escaped start and the digest of its whole escape', async () => {
      const bad = `${'y'.repeat(5000)}\0`;
      const { envelope } = await answer('isphere_search_contacts', { query: bad });
      const row = await server.sql('audit_events').where({ seq: envelope!.audit.audit_seq }).first();
      const recorded = rowDetails(row).invalid_argument as Record<string, unknown>;
      assert.equal(recorded.value_truncated, true);
      assert.equal(recorded.at, 5000);
      assert.equal(recorded.value_sha256, createHash('sha256').update(escapeText(bad)).digest('hex'));
    });

    it('audits an unknown tool name cut inside an emoji or holding a NUL, -32602 and never -32603', async () => {
      const names = [`${'x'.repeat(199)}\u{1F600}`, 'no\0such', 'no\uDE00such', `${'y'.repeat(300)}\0`];
      for (const name of names) {
        const before = await headSeq();
        const got = await answer(name, {});
        assert.equal(got.data?.code, 'UNKNOWN_TOOL', JSON.stringify(got));
        const row = await server.sql('audit_events').where('seq', '>', before).first();
        assert.ok(row, 'the call has its row');
        assert.equal(row.error_code, 'UNKNOWN_TOOL');
        assert.equal(unescapeText(row.tool), cutText(name, 200));
        // Escaped only when what is stored (the first 200 characters) holds what cannot be stored.
        assert.equal(rowDetails(row).tool_escaped, unsafeText(cutText(name, 200)) ? true : undefined);
        const whole = unsafeText(name) ? escapeText(name) : name;
        assert.equal(rowDetails(row).tool_sha256, createHash('sha256').update(whole).digest('hex'));
      }
    });

    it('answers every call, whatever strings it holds in any argument or its name, and records each', async () => {
      const next = random(kind === 'pglite' ? 1 : 2);
      const tools = ['isphere_search_contacts', 'isphere_send_message', 'isphere_remember', 'isphere_recall'];
      for (let i = 0; i < 80; i++) {
        const name = next() < 0.2 ? stringOf(next) : tools[Math.floor(next() * tools.length)]!;
        const args: Record<string, unknown> = {};
        for (let k = Math.floor(next() * 4); k > 0; k--) {
          const key = next() < 0.3 ? stringOf(next) : ['query', 'target_id', 'content_text', 'key'][k % 4]!;
          args[key] = next() < 0.2 ? [stringOf(next), { [stringOf(next)]: stringOf(next) }] : stringOf(next);
        }
        const before = await headSeq();
        const got = await answer(name, args);
        const what = JSON.stringify({ name, args });
        if (got.rpc !== undefined) assert.notEqual(got.rpc, -32603, what);
        else assert.equal(typeof got.envelope?.ok, 'boolean', what);
        assert.ok((await headSeq()) > before, `no row for ${what}`);
      }
    });
  });
}
