import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { childEnv, noConfigFile } from '../helpers/built.ts';
import { runCli } from '../helpers/cli.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { ROOT, testEnv } from '../helpers/server.ts';

/**
 * A countersign.config.json that a developer keeps in the checkout (the tests' children run there)
 * never reaches a test: every child gets the empty config file unless its test names one.
 */
describe("a config file in the checkout stays out of the tests' children", () => {
  const file = path.join(ROOT, 'countersign.config.json');
  // A developer's own file is left alone (the test then runs beside it); else one that breaks any start.
  const planted = !fs.existsSync(file);
  let db: TestDatabase;
  before(async () => {
    db = await createTestDatabase('pglite');
    if (planted) fs.writeFileSync(file, JSON.stringify({ http: { port: 'not a port' } }));
  });
  after(async () => {
    if (planted) fs.rmSync(file, { force: true });
    await db?.drop();
  });

  it('gives every child the empty config unless its test names one', async () => {
    assert.equal(fs.readFileSync(noConfigFile(), 'utf8').trim(), '{}');
    assert.equal(childEnv({}).COUNTERSIGN_CONFIG, noConfigFile());
    assert.equal(childEnv({ COUNTERSIGN_CONFIG: '/x.json' }).COUNTERSIGN_CONFIG, '/x.json');
    const listed = await runCli(['agent', 'list'], testEnv(db));
    assert.equal(listed.code, 0, listed.stderr);
    assert.doesNotMatch(listed.stderr, /configuration error/);
  });
});
