import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { build } from 'esbuild';
import { sourceStack } from '../src/core/stack.ts';
import { serializeError } from '../src/log.ts';

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
    const mapped = sourceStack(thrown.stack!);
    assert.match(
      mapped,
      new RegExp(`at (Object\\.)?fail \\(${source.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}:5:\\d+\\)`),
    );
    assert.doesNotMatch(mapped.split('\n')[1]!, /dist\/thrower\.js/);
    // The message and the frames of this test file are as they were.
    assert.equal(mapped.split('\n')[0], 'Error: failed: on purpose');
    assert.ok(mapped.includes(import.meta.filename));
  });

  it("is what the server's log writes for an error", () => {
    const logged = serializeError(thrown) as { message: string; stack: string };
    assert.equal(logged.message, 'failed: on purpose');
    assert.equal(logged.stack, sourceStack(thrown.stack!));
    assert.ok(logged.stack.includes(`${source}:5:`));
    // Not an error: as pino leaves it.
    assert.equal(serializeError('just text'), 'just text');
  });

  it('leaves a stack alone when it has no frame of a build, or no map can be read', () => {
    const plain = new Error('here').stack!;
    assert.equal(sourceStack(plain), plain);
    const unmapped = `Error: x\n    at f (${path.join(root, 'dist', 'missing.js')}:3:7)`;
    assert.equal(sourceStack(unmapped), unmapped);
  });
});
