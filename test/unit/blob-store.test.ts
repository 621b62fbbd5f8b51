import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { createBlobStore } from '../../src/connectors/local/blobs.ts';

describe('the blob store read back by a hash from the database', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'blobs-'));
  const blobs = createBlobStore(path.join(dir, 'blobs'));
  fs.writeFileSync(path.join(dir, 'audit-signing-key.pem'), '-----BEGIN PRIVATE KEY-----\n');

  it('gives the bytes stored under a hash', async () => {
    const { sha256 } = await blobs.put(Buffer.from('hello'));
    assert.equal((await blobs.read(sha256))?.toString(), 'hello');
  });

  it('names no file outside the store, whatever the value', async () => {
    for (const name of ['../audit-signing-key.pem', '../../audit-signing-key.pem', '', 'A'.repeat(64)])
      assert.equal(await blobs.read(name), undefined);
  });

  it('refuses bytes that no longer hash to their name', async () => {
    const { sha256 } = await blobs.put(Buffer.from('approved bytes'));
    fs.writeFileSync(blobs.pathOf(sha256), 'other bytes');
    assert.equal(await blobs.read(sha256), undefined);
  });
});
