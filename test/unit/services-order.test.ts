import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { assemble, GIVEN, SERVICES, SHAPED } from '../../src/app/services.ts';
import {
  checkOrder,
  defineService,
  type AnyServiceFactory,
  type Parts,
} from '../../src/app/services/parts.ts';
import type { Config } from '../../src/config.ts';
import type { Logger } from '../../src/log.ts';

/*
 * The list of services (src/app/services.ts) opens each factory after the parts it needs. Checked here
 * without opening anything; assemble itself is driven over stand-in factories, with no database.
 */

const named = (name: string) => {
  const found = SERVICES.find((f) => f.name === name);
  assert.ok(found, `no service named ${name}`);
  return found;
};

/** The list with `name` moved to just after `after`. */
const moved = (name: string, after: string) => {
  const rest = SERVICES.filter((f) => f.name !== name);
  const at = rest.findIndex((f) => f.name === after);
  return [...rest.slice(0, at + 1), named(name), ...rest.slice(at + 1)];
};

describe('the list of services', () => {
  it('opens every factory after the parts it needs, and ends with every part the services are shaped from', () => {
    assert.doesNotThrow(() => checkOrder(SERVICES, GIVEN, SHAPED));
  });

  it('names each factory once', () => {
    const names = SERVICES.map((f) => f.name);
    assert.deepEqual(names, [...new Set(names)]);
  });

  it('refuses a factory listed before a part it needs, naming both', () => {
    assert.throws(
      () => checkOrder(moved('storage', 'audit'), GIVEN, SHAPED),
      /service "audit" needs db, roots, which no service before it provides/,
    );
    assert.throws(
      () => checkOrder(moved('approvals', 'pipeline'), GIVEN),
      /service "pipeline" needs approvals/,
    );
  });

  it('refuses a part provided twice', () => {
    assert.throws(
      () => checkOrder([...SERVICES, named('blobs')], GIVEN),
      /service "blobs" provides blobs, already provided/,
    );
  });

  it('refuses a list that ends without a part the services are shaped from', () => {
    const withoutPages = SERVICES.filter((f) => f.name !== 'pages');
    assert.throws(() => checkOrder(withoutPages, GIVEN, SHAPED), /no service provides signIn, auditReader/);
  });
});

describe('assembling the services', () => {
  const logged: unknown[] = [];
  const log = { error: (fields: unknown) => logged.push(fields) } as unknown as Logger;
  const given = { config: {} as Config, log, command: 'test', faults: undefined, onDatabase: undefined };

  /** Stand-in factories that record what they were given and when they open and close. */
  function standIns(events: string[], failing?: string) {
    const factory = (name: string, needs: (keyof Parts)[], provides: (keyof Parts)[]): AnyServiceFactory =>
      defineService({
        name,
        needs,
        provides,
        open(have, closers) {
          events.push(`open ${name} with ${Object.keys(have).join(',')}`);
          if (name === failing) throw new Error(`${name} failed`);
          closers.push(async () => void events.push(`close ${name}`));
          // Strings stand in for the parts: assemble only passes them on.
          return Object.fromEntries(provides.map((p) => [p, `${name}'s ${p}`])) as unknown as Parts;
        },
      });
    return [
      factory('storage', ['config'], ['db']),
      factory('audit', ['db'], ['audit']),
      factory('approvals', ['db', 'audit'], ['approvals']),
    ];
  }

  it('opens each factory in order with only the parts it declares, and closes in reverse', async () => {
    const events: string[] = [];
    const { have, closeAll } = await assemble(standIns(events), given, ['approvals']);
    assert.equal(have.approvals as unknown, "approvals's approvals");
    await closeAll();
    assert.deepEqual(events, [
      'open storage with config',
      'open audit with db',
      'open approvals with db,audit',
      'close approvals',
      'close audit',
      'close storage',
    ]);
  });

  it('closes what opened, in reverse, when a factory fails, and throws the failure', async () => {
    const events: string[] = [];
    await assert.rejects(assemble(standIns(events, 'approvals'), given), /approvals failed/);
    assert.deepEqual(events.slice(-2), ['close audit', 'close storage']);
  });

  it('refuses a misordered list before anything opens', async () => {
    const events: string[] = [];
    const [storage, audit, approvals] = standIns(events);
    await assert.rejects(
      assemble([storage!, approvals!, audit!], given),
      /service "approvals" needs audit, which no service before it provides/,
    );
    assert.deepEqual(events, []);
  });
});
