import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { promisify } from 'node:util';
import { loadSigner } from '../../src/audit/signing.ts';
import { isAppError } from '../../src/core/errors.ts';
import { ROOT } from '../helpers/server.ts';

const run = promisify(execFile);

describe('the audit signing key of a data directory', () => {
  it('refuses a key file that holds no key (empty, or not PEM) as a configuration error', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-key-'));
    for (const [name, content] of [
      ['empty.pem', ''],
      ['text.pem', 'not a key\n'],
    ]) {
      fs.writeFileSync(path.join(dir, name!), content!);
      assert.throws(
        () => loadSigner(dir, path.join(dir, name!)),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID', 'config') && err.message.includes(name!),
      );
    }
  });

  it('is one key when several processes start on an empty directory at once', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-key-'));
    try {
      // All start loading at the same instant, as replicas released by one migration lock do.
      const at = Date.now() + 3000;
      const script = `import { loadSigner } from ${JSON.stringify(path.join(ROOT, 'src/audit/signing.ts'))};
        while (Date.now() < ${at});
        process.stdout.write(loadSigner(${JSON.stringify(dir)}).key_id);`;
      const ids = await Promise.all(
        Array.from({ length: 8 }, () =>
          run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT }),
        ),
      );
      assert.equal(new Set(ids.map((r) => r.stdout)).size, 1, 'every process read the same key');
      assert.deepEqual(fs.readdirSync(dir), ['audit-signing-key.pem'], 'no file left aside');
      assert.equal(fs.statSync(path.join(dir, 'audit-signing-key.pem')).mode & 0o777, 0o600);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
