import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runCli, spawnServer, stopChild } from './helpers/cli.ts';
import { createTestDatabase, type TestDatabase } from './helpers/db.ts';
import { testEnv, waitFor } from './helpers/server.ts';

/** Something else listening on a loopback port. */
async function occupy(): Promise<{ port: number; close(): Promise<void> }> {
  const blocker = net.createServer();
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
  const { port } = blocker.address() as net.AddressInfo;
  return { port, close: () => new Promise<void>((resolve) => blocker.close(() => resolve())) };
}

describe('start-up on a fresh data directory', () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  before(async () => {
    db = await createTestDatabase('pglite');
    // A data dir with nothing in it: the first run has not happened.
    fs.rmSync(path.join(db.dataDir, 'pglite'), { recursive: true, force: true });
    env = testEnv(db);
  });
  after(async () => db?.drop());

  it('refuses a taken port before it sets anything up, so the first run is not spent', async () => {
    const blocker = await occupy();
    try {
      const res = await runCli(['serve'], { ...env, COUNTERSIGN_PORT: String(blocker.port) });
      assert.equal(res.code, 1);
      assert.match(res.stderr, new RegExp(`port ${blocker.port} .*in use; set COUNTERSIGN_PORT`));
      assert.doesNotMatch(res.stderr, /\n\s+at /, 'no stack trace');
      assert.equal(fs.existsSync(path.join(db.dataDir, 'pglite')), false, 'no database was created');
    } finally {
      await blocker.close();
    }
    // The next start, on a free port, is the first run: its credentials are printed.
    const server = await spawnServer(env);
    try {
      await waitFor('the first-run banner', async () =>
        /demo agent token \(shown once\): cs_/.test(server.stderr()) ? true : undefined,
      );
    } finally {
      await stopChild(server.child);
    }
  });
});
