import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { build } from 'esbuild';
import { sourceStack } from '../../src/core/stack.ts';
import { serializeError } from '../../src/log.ts';

/**
 * The built server runs without --enable-source-maps (docs/performance.md); the stacks it prints are
 * mapped to the sources when printed. A module built here the way scripts/build.ts builds dist/ (esbuild,
 * ESM, a map beside it) throws from a known line of its TypeScript source.
 */
describe('stack traces of the built server', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-stack-'));
  const source = path.join(root, 'src', 'thrower.ts');
  const built = path.join(root, 'dist', 'thrower.js');
  let thrown: Error;

  before(async () => {
    fs.mkdirSync(path.dirname(source), { recursive: true });
    fs.writeFileSync(
      source,
      [
        'type Reason = { why: string };',
        '',
        'export function fail(reason: Reason): never {',
        '  const message: string = `failed: ${reason.why}`;',
        '  throw new Error(message);',
        '}',
        '',
      ].join('\n'),
    );
    await build({
      entryPoints: [source],
      outdir: path.dirname(built),
      platform: 'node',
      format: 'esm',
      bundle: true,
      sourcemap: true,
      logLevel: 'silent',
    });
    const mod = (await import(pathToFileURL(built).href)) as { fail(r: { why: string }): never };
    try {
      mod.fail({ why: 'on purpose' });
    } catch (err) {
      thrown = err as Error;
    }
  });
  after(() => fs.rmSync(root, { recursive: true, force: true }));

  it('names the source file and line of a frame of the build', () => {
    assert.match(thrown.stack!, /dist\/thrower\.js:\d+:\d+/, 'the raw stack names the build');
    const mapped = sourceStack(thrown.stack!, path.dirname(built));
    assert.match(
      mapped,
      new RegExp(`at (Object\\.)?fail \\(${source.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}:5:\\d+\\)`),
    );
    assert.doesNotMatch(mapped.split('\n')[1]!, /dist\/thrower\.js/);
    // The message and the frames of this test file are as they were.
    assert.equal(mapped.split('\n')[0], 'Error: failed: on purpose');
    assert.ok(mapped.includes(import.meta.filename));
  });

  it("is what the server's log writes for an error, for the server's own build", () => {
    const logged = serializeError(thrown) as { message: string; stack: string };
    assert.equal(logged.message, 'failed: on purpose');
    assert.equal(logged.stack, sourceStack(thrown.stack!));
    // This build is not the process's own (under tsx, src/core/): its frames stay as they are.
    assert.equal(logged.stack, thrown.stack);
    // Not an error: as pino leaves it.
    assert.equal(serializeError('just text'), 'just text');
  });

  it('reads no file a message names, nor one outside the build', () => {
    const dist = path.dirname(built);
    // A map that would be read, were the path followed out of the build.
    fs.mkdirSync(path.join(root, 'outside'), { recursive: true });
    fs.copyFileSync(`${built}.map`, path.join(root, 'outside', 'thrower.js.map'));
    const frame = /\((.*dist\/thrower\.js):(\d+):(\d+)\)/.exec(thrown.stack!)!;
    const [, , row, column] = frame;
    const cases = [
      // A message that names a file of the build, as an error's text may.
      `Error: could not load ${built}:${row}:${column}\n    at nothing (node:internal/x:1:1)`,
      // A frame whose path leaves the build by `..`.
      `Error: x\n    at f (${dist}/../outside/thrower.js:${row}:${column})`,
    ];
    for (const stack of cases) assert.equal(sourceStack(stack, dist), stack);
    // Another build's frames are left as they are.
    assert.equal(sourceStack(thrown.stack!, path.join(root, 'src')), thrown.stack);
  });

  it('leaves a stack alone when it has no frame of a build, or no map can be read', () => {
    const plain = new Error('here').stack!;
    assert.equal(sourceStack(plain), plain);
    const unmapped = `Error: x\n    at f (${path.join(root, 'dist', 'missing.js')}:3:7)`;
    assert.equal(sourceStack(unmapped, path.join(root, 'dist')), unmapped);
  });
});
