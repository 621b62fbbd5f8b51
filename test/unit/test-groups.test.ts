import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ALONE, deal } from '../../scripts/test-groups.ts';
import { ROOT } from '../../scripts/build-inputs.ts';

/** npm test deals the files into a few processes (scripts/test.ts): none lost, none twice. */
describe('the test files dealt into processes', () => {
  const files = ['unit', 'store', 'e2e'].flatMap((folder) =>
    fs
      .readdirSync(path.join(ROOT, 'test', folder))
      .filter((f) => f.endsWith('.test.ts'))
      .map((f) => `test/${folder}/${f}`),
  );

  it('puts every file in exactly one group, and no more groups than asked besides those alone', () => {
    for (const groups of [1, 3, 8, 500]) {
      const dealt = deal(files, groups);
      assert.deepEqual(dealt.flat().sort(), [...files].sort(), `${groups} groups`);
      assert.ok(dealt.length <= groups + ALONE.length, `${dealt.length} groups for ${groups}`);
      assert.ok(dealt.every((g) => g.length > 0));
    }
  });

  it('finds no hook at the top of a file, where it would run around every file of its group', () => {
    const hooked = files.filter((f) =>
      /^(before|after|beforeEach|afterEach)\(/m.test(fs.readFileSync(path.join(ROOT, f), 'utf8')),
    );
    assert.deepEqual(hooked, [], 'put the hooks inside a describe');
  });

  it('runs a file that measures its own process alone, first', () => {
    for (const file of ALONE) assert.ok(files.includes(file), `${file} exists`);
    const dealt = deal(files, 8);
    assert.deepEqual(
      dealt.slice(0, ALONE.length),
      ALONE.map((f) => [f]),
    );
    for (const group of dealt.slice(ALONE.length)) for (const f of ALONE) assert.ok(!group.includes(f));
  });
});
