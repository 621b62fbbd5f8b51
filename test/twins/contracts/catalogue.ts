import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Config } from '../../../src/config.ts';
import { loadProfiles } from '../../../src/core/profiles.ts';
import type { Catalogue } from '../../../src/server/catalogue.ts';
import { builtinTools, type AnyToolDef } from '../../../src/tools/index.ts';

/** What the seam asks of the catalogue, held for the real one and its twin (both need no database). */
export function catalogueContract(
  name: string,
  config: Config,
  make: (tools: readonly AnyToolDef[]) => Catalogue,
) {
  const prefix = config.tools.prefix;
  const profiles = loadProfiles();
  describe(`the catalogue contract: ${name}`, () => {
    it('finds each built-in under the prefix, and nothing else', () => {
      const catalogue = make(builtinTools);
      for (const tool of builtinTools) {
        const entry = catalogue.lookup(prefix + tool.name);
        assert.equal(entry.kind === 'tool' && entry.tool, tool, tool.name);
        assert.equal(catalogue.lookup(tool.name).kind, 'unknown');
      }
      assert.equal(catalogue.lookup('').kind, 'unknown');
    });

    it('lists what a profile allows, in the order of the tools, and nothing without a profile', () => {
      const catalogue = make(builtinTools);
      for (const [profileName, profile] of profiles) {
        const expected = builtinTools.filter((t) => profile.allowed.has(t.facet)).map((t) => prefix + t.name);
        assert.deepEqual(
          catalogue.listFor(profile).map((t) => t.name),
          expected,
          profileName,
        );
      }
      assert.deepEqual(catalogue.listFor(undefined), []);
    });

    it('marks writes as tasks-capable and reads as read-only in their listing', () => {
      const listing = make(builtinTools).listFor(profiles.get('all'));
      const send = listing.find((t) => t.name === `${prefix}send_message`)!;
      const search = listing.find((t) => t.name === `${prefix}search_contacts`)!;
      assert.deepEqual([send.annotations?.readOnlyHint, send.execution?.taskSupport], [false, 'optional']);
      assert.deepEqual([search.annotations?.readOnlyHint, search.execution], [true, undefined]);
    });

    it('hands back an unsubscribe for list changes', () => {
      const unsubscribe = make(builtinTools).onChanged(() => {});
      assert.equal(typeof unsubscribe, 'function');
      unsubscribe();
    });
  });
}
