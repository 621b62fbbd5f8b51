import assert from 'node:assert/strict';
import fs from 'node:fs';
import { it } from 'node:test';
import { REFERENCE_FILE, toolReference } from '../../scripts/tool-reference.ts';

it("docs/tools.md is the reference the tools' schemas make now (npm run docs:tools)", async () => {
  const now = await toolReference();
  assert.equal(
    fs.readFileSync(REFERENCE_FILE, 'utf8'),
    now,
    'docs/tools.md is stale: run npm run docs:tools',
  );
  // Every tool and every argument is there: a schema change shows up in the reference.
  for (const name of ['isphere_send_message', 'isphere_search_groups', 'isphere_get_approval']) {
    assert.match(now, new RegExp(`## \`${name}\``));
  }
  assert.match(now, /\| `content_text` +\|/);
  assert.match(now, /\| `approval_id` +\|/);
});

it('gives every built-in argument a meaning, marks alternatives, and shows no bounds zod adds of its own', async () => {
  const now = await toolReference();
  assert.doesNotMatch(now, /9007199254740991/, "the safe-integer bounds are not the tool's");
  // An argument row: name, type, required, meaning. None has an empty meaning.
  const blank = now
    .split('\n')
    .filter((line) => /^\| `[a-z_]+` /.test(line) && / \| +\|$/.test(line) && line.split(' | ').length === 4);
  assert.deepEqual(blank, [], 'arguments without a meaning');
  for (const id of ['approval_request_id', 'approval_id'])
    assert.match(
      now,
      new RegExp(`\\| \`${id}\` +\\| [^|]+ \\| one of \`approval_request_id\` or \`approval_id\` \\|`),
    );
});
