import { randomBytes } from 'node:crypto';
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createSessionStore, type SessionStore } from '../../src/accounts/index.ts';
import { adminDeps } from '../../src/app/admin-deps.ts';
import { webCommands } from '../../src/app/web-commands.ts';
import { loadConfig } from '../../src/config.ts';
import { createBlobStore } from '../../src/connectors/index.ts';
import { isAppError } from '../../src/core/errors.ts';
import type { User } from '../../src/core/identity.ts';
import type { RunCommand } from '../../src/web/account-kit.ts';
import { databaseKinds, openMigratedDatabase } from '../helpers/db.ts';
import { inMemoryPeople } from '../helpers/twins.ts';

/** What the account pages stand on: the user commands and the sessions, over the same people. */
interface People {
  run: RunCommand;
  sessions: SessionStore;
}

const LIFETIME = { idleMs: 60_000, absoluteMs: 3_600_000 };
const actor = 'test';

/** A refusal as the pages show it: its code and reason (the wording may differ), or its message when it has no reason. */
const refusalOf = (p: Promise<unknown>) =>
  p.then(
    () => 'done',
    (err: unknown) =>
      !isAppError(err)
        ? `thrown: ${String(err)}`
        : err.reason
          ? `${err.code}/${err.reason}`
          : `${err.code}/-: ${err.message}`,
  );

const namesAndRoles = async (run: RunCommand) =>
  (
    (await run({ command: 'user.list' })) as {
      users: { name: string; roles: string[]; disabled_at: unknown }[];
    }
  ).users.map((u) => `${u.name}:${u.roles.join('+')}${u.disabled_at ? ':disabled' : ''}`);

function answersAlike(name: string, open: () => Promise<People>) {
  describe(`the account pages' stores: ${name}`, () => {
    let people: People;
    let ann: User;
    before(async () => {
      people = await open();
      ({ user: ann } = (await people.run({
        command: 'user.add',
        name: 'ann',
        roles: ['admin'],
        password: 'twin test 1',
        actor,
      })) as { user: User });
      await people.run({
        command: 'user.add',
        name: 'bob',
        roles: ['chair'],
        password: 'twin test 2',
        actor,
      });
    });

    it('lists users by name with their roles, and refuses a name taken ignoring case', async () => {
      assert.deepEqual(await namesAndRoles(people.run), ['ann:admin', 'bob:chair']);
      assert.equal(
        await refusalOf(
          people.run({ command: 'user.add', name: 'ANN', roles: ['chair'], password: 'long enough', actor }),
        ),
        'CONFLICT/user_exists',
      );
      assert.equal(
        await refusalOf(
          people.run({ command: 'user.add', name: 'cy', roles: ['chair'], password: 'short', actor }),
        ),
        'CONFIG_INVALID/-: password: at least 8 characters',
      );
    });

    it('never leaves the server without an active admin, and refuses unknown users', async () => {
      assert.equal(
        await refusalOf(people.run({ command: 'user.set', name: 'ann', roles: ['chair'], actor })),
        'CONFLICT/last_admin',
      );
      assert.equal(
        await refusalOf(people.run({ command: 'user.disable', name: 'ann', actor })),
        'CONFLICT/last_admin',
      );
      assert.equal(
        await refusalOf(people.run({ command: 'user.disable', name: 'nobody', actor })),
        'NOT_FOUND/unknown_user',
      );
      assert.deepEqual(
        await people.run({ command: 'user.set', name: 'bob', roles: ['chair', 'admin'], actor }),
        {
          user: 'bob',
          roles: ['chair', 'admin'],
        },
      );
      assert.deepEqual(
        await people.run({ command: 'user.set_email', name: 'bob', email: 'bob@example.org', actor }),
        {
          user: 'bob',
          email: 'bob@example.org',
        },
      );
    });

    it('loads a live session with the user’s current roles; a reset password or disabling ends it', async () => {
      assert.equal(await people.sessions.load('not-a-session'), undefined);
      assert.equal(await people.sessions.load('x'.repeat(101)), undefined);
      const bob = (await people.sessions.create({
        id: await idOf(people, 'bob'),
        name: 'bob',
        roles: ['chair'],
      }))!;
      const mine = await people.sessions.create(ann);
      assert.deepEqual((await people.sessions.load(bob.id))?.user.roles, ['chair', 'admin']);
      assert.equal((await people.sessions.load(mine.id))?.csrf, mine.csrf);
      await people.run({ command: 'user.reset_password', name: 'ann', password: 'a new one 1', actor });
      assert.equal(await people.sessions.load(mine.id), undefined);
      await people.run({ command: 'user.disable', name: 'bob', actor });
      assert.equal(await people.sessions.load(bob.id), undefined);
      assert.deepEqual(await namesAndRoles(people.run), ['ann:admin', 'bob:chair+admin:disabled']);
      const again = await people.sessions.create(ann);
      await people.sessions.destroy(again.id);
      assert.equal(await people.sessions.load(again.id), undefined);
    });
  });
}

/** A user's id as a session needs it: the twin's and the database's are each their own. */
const ids = new WeakMap<People, Map<string, string>>();
async function idOf(people: People, name: string): Promise<string> {
  const id = ids.get(people)?.get(name);
  if (!id) throw new Error(`no id recorded for ${name}`);
  return id;
}

answersAlike('in memory', async () => {
  const twin = inMemoryPeople(LIFETIME);
  const people = { run: twin.run, sessions: twin.sessions };
  ids.set(people, new Map());
  const run: RunCommand = async (input) => {
    const out = await twin.run(input);
    for (const held of twin.people.values()) ids.get(people)!.set(held.name, held.id);
    return out;
  };
  return Object.assign(people, { run });
});

for (const kind of databaseKinds()) {
  let close = async () => {};
  after(() => close());
  answersAlike(`${kind}, through the operator's commands`, async () => {
    const { testDb, db } = await openMigratedDatabase(kind);
    close = async () => {
      await db.close();
      await testDb.drop();
    };
    const config = loadConfig({}, testDb.dataDir);
    const commands = webCommands(
      adminDeps({ knex: db.knex, blobs: createBlobStore(path.join(testDb.dataDir, 'blobs')), config }),
    );
    const people: People = {
      run: commands,
      sessions: createSessionStore(db.knex, LIFETIME, randomBytes(32)),
    };
    ids.set(people, new Map());
    const run: RunCommand = async (input) => {
      const out = await commands(input);
      for (const r of (await db.knex('users').select('id', 'name')) as { id: string; name: string }[])
        ids.get(people)!.set(r.name, r.id);
      return out;
    };
    return Object.assign(people, { run });
  });
}
