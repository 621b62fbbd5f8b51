import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { ConnectorSet } from '../../../src/connectors/index.ts';
import type { AppError } from '../../../src/core/errors.ts';

/** The directory both sides of the contract hold (the local store imports it; the twin is given it). */
export const CONTRACT_CONTACTS = [
  { id: 'c_ada', display_name: 'Ada Lovelace', account: 'ada', active: true },
  { id: 'c_alan', display_name: 'Alan Turing', account: 'alan', active: true },
  { id: 'c_grace', display_name: 'Grace Hopper', account: 'grace', active: false },
  { id: 'c_twin1', display_name: 'Sam Twin', account: 'sam1', active: true },
  { id: 'c_twin2', display_name: 'Sam Twin', account: 'sam2', active: true },
];

const refusal = (err: unknown) => [(err as AppError).code, (err as AppError).reason];

/**
 * What the seam's tools ask of the connector set, held for the local connector on a database
 * (test/store/) and the twin (test/unit/): picking, resolving a write's target, sending once per key,
 * finding a write by its key, searching contacts.
 */
export function connectorSetContract(
  name: string,
  open: () => Promise<{ set: ConnectorSet; executingKey(): Promise<string> }>,
) {
  describe(`the connector set contract: ${name}`, () => {
    it('picks the default for auto, and refuses a source that is not configured', async () => {
      const { set } = await open();
      assert.equal(set.pick('auto').source, 'local');
      assert.equal(set.pick('local').source, 'local');
      assert.throws(
        () => set.pick('bridge'),
        (err) => refusal(err).join() === 'SOURCE_UNAVAILABLE,source_not_configured',
      );
    });

    it('resolves a contact by id, by name and by account', async () => {
      const local = (await open()).set.pick('auto');
      const ada = { target_type: 'contact', target_id: 'c_ada', display_name: 'Ada Lovelace' };
      for (const ref of ['c_ada', 'Ada Lovelace', 'ada']) {
        const { lookalikes: _l, external: _e, ...target } = await local.resolveTarget('contact', ref);
        assert.deepEqual(target, ada, ref);
      }
    });

    it('refuses a target it cannot name: none, several, inactive', async () => {
      const local = (await open()).set.pick('auto');
      const cases: [string, string][] = [
        ['nobody', 'TARGET_NOT_FOUND,contact_not_found'],
        ['Sam Twin', 'AMBIGUOUS_TARGET,several_matches'],
        ['c_grace', 'PERMISSION_DENIED,contact_inactive'],
      ];
      for (const [ref, expected] of cases) {
        await assert.rejects(local.resolveTarget('contact', ref), (err) => refusal(err).join() === expected);
      }
    });

    it('sends once per key while its approval executes, and finds the write by its key', async () => {
      const { set, executingKey } = await open();
      const local = set.pick('auto');
      const target = await local.resolveTarget('contact', 'c_alan');
      const key = await executingKey();
      assert.deepEqual(await local.findWrite(key), { found: false });
      const first = await local.sendMessage({ target, text: 'hello', key });
      const again = await local.sendMessage({ target, text: 'hello', key });
      assert.equal(again.ref, first.ref);
      assert.deepEqual(await local.findWrite(key), { found: true, ref: first.ref });
    });

    it('writes nothing for a key whose approval is not executing', async () => {
      const local = (await open()).set.pick('auto');
      const target = await local.resolveTarget('contact', 'c_alan');
      const key = crypto.randomUUID();
      await assert.rejects(
        local.sendMessage({ target, text: 'hello', key }),
        (err) => refusal(err).join() === 'CONNECTOR_FAILED,write_fenced',
      );
      assert.deepEqual(await local.findWrite(key), { found: false });
    });

    it('searches contacts by name, leaving out the inactive unless asked', async () => {
      const local = (await open()).set.pick('auto');
      const ids = async (query: string, includeInactive: boolean) =>
        (await local.searchContacts({ query, includeInactive, limit: 10 })).items
          .map((c) => c.contact_id)
          .sort();
      assert.deepEqual(await ids('lovelace', false), ['c_ada']);
      assert.deepEqual(await ids('hopper', false), []);
      assert.deepEqual(await ids('hopper', true), ['c_grace']);
    });
  });
}
