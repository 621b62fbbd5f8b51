import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { databaseKinds } from '../helpers/db.ts';
import { gc } from '../helpers/gc.ts';
import { call, connectHttp, ROOT, startTestServer, type TestServer } from '../helpers/server.ts';
import { startUpstreamFixture, type UpstreamFixture } from '../helpers/upstream-fixture.ts';

const FS_SERVER = path.join(ROOT, 'node_modules/@modelcontextprotocol/server-filesystem/dist/index.js');

/** The live heap after full collections, in bytes. */
async function liveHeap(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc();
    await new Promise((r) => setImmediate(r));
  }
  return process.memoryUsage().heapUsed;
}

/** Calls `fn` `count` times, `width` at a time. */
async function drive(count: number, width: number, fn: () => Promise<void>) {
  let next = 0;
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next++ < count) await fn();
    }),
  );
}

const CALLS = 2000;
/**
 * The bound on what the heap may keep after CALLS calls. A call keeps nothing, so what remains is noise
 * (JIT code, pools warming up: under 1.5 MB after the warm-up below); 4 KB kept per call, the defect
 * this guards against, is 8 MB, and anything from 2 KB a call up fails. (3,000 calls took the suite's
 * longest file to 145 s a database.)
 */
const BOUND_BYTES = 4 * 1024 * 1024;

for (const kind of databaseKinds()) {
  describe(`memory on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let crm: UpstreamFixture;
    let workDir: string;
    let file: string;

    before(async () => {
      workDir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-mem-')));
      file = path.join(workDir, 'one-kib.txt');
      fs.writeFileSync(file, 'x'.repeat(1024));
      crm = await startUpstreamFixture();
      const configFile = path.join(workDir, 'config.json');
      fs.writeFileSync(
        configFile,
        JSON.stringify({
          upstreams: [
            { name: 'fs', command: process.execPath, args: [FS_SERVER, workDir] },
            { name: 'crm', url: crm.url },
          ],
        }),
      );
      server = await startTestServer(kind, { COUNTERSIGN_CONFIG: configFile });
      agent = await connectHttp(server.url, server.demoToken);
    });

    after(async () => {
      await agent?.close();
      await server?.stop();
      await crm?.close();
      fs.rmSync(workDir, { recursive: true, force: true });
    });

    const readOnce = async () => {
      const res = await call(agent, 'fs__read_text_file', { path: file });
      assert.equal(res.ok, true, JSON.stringify(res.error));
    };
    const crmOnce = async () => {
      const res = await call(agent, 'crm__get_note', {});
      assert.equal(res.ok, true, JSON.stringify(res.error));
    };
    const searchOnce = async () => {
      const res = await call(agent, 'isphere_search_contacts', { query: 'a', limit: 5 });
      assert.equal(res.ok, true, JSON.stringify(res.error));
    };

    const cases: [string, () => Promise<void>][] = [
      ['proxied upstream calls', readOnce],
      ['built-in reads', searchOnce],
    ];
    // An upstream over HTTP holds nothing of the database's: its path is checked once, on the last kind
    // (PostgreSQL when the suite has it, the faster one).
    if (kind === databaseKinds().at(-1)) cases.push(['proxied calls to an upstream over HTTP', crmOnce]);
    for (const [what, once] of cases) {
      it(`keeps nothing per call: ${CALLS} ${what} leave the live heap where it was`, async (t) => {
        // Warm up long enough for what settles once (JIT code, connection pools, prepared paths, inline
        // caches): after 300 calls, that alone left 2-5 MB after the measured 3,000, and no more after
        // 12,000; after 1,500 it leaves under 1.5 MB.
        await drive(1500, 8, once);
        const start = await liveHeap();
        await drive(CALLS, 8, once);
        const grown = (await liveHeap()) - start;
        t.diagnostic(`live heap ${(start / 1048576).toFixed(1)} MB → +${(grown / 1048576).toFixed(2)} MB`);
        assert.ok(
          grown < BOUND_BYTES,
          `live heap grew ${(grown / 1024 / 1024).toFixed(1)} MB over ${CALLS} calls (${Math.round(grown / CALLS)} B per call)`,
        );
      });
    }
  });
}
