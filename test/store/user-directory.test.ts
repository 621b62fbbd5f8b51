import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { changeUser, createUser, createUserDirectory, setUserEmail } from '../../src/accounts/index.ts';
import type { UserDirectory } from '../../src/accounts/index.ts';
import type { SlackApi } from '../../src/notify/slack.ts';
import { mapSlackUser } from '../../src/web/slack-users.ts';
import { databaseKinds, openMigratedDatabase } from '../helpers/db.ts';
import { inMemoryDirectory, type Person } from '../helpers/twins.ts';

/** The same people, in the database and in the twin: Ann, two Bobs at one address, Cy (disabled). */
const PEOPLE = [
  { name: 'Ann', email: 'ann@example.org' },
  { name: 'bob1', email: 'bob@example.org' },
  { name: 'bob2', email: 'Bob@Example.org' },
  { name: 'cy', email: 'cy@example.org', disabled: true },
];

function answersAlike(name: string, open: () => Promise<UserDirectory>) {
  describe(`the user directory: ${name}`, () => {
    let people: UserDirectory;
    before(async () => {
      people = await open();
    });

    it('finds an active user by name, ignoring case, and no disabled one', async () => {
      assert.equal((await people.activeNamed('ann'))?.name, 'Ann');
      assert.deepEqual((await people.activeNamed('ANN'))?.roles, ['chair']);
      assert.equal(await people.activeNamed('cy'), undefined);
      assert.equal(await people.activeNamed('nobody'), undefined);
    });

    it('finds active users by address, ignoring case, at most `limit` of them', async () => {
      assert.deepEqual(
        (await people.activeWithEmail('ANN@example.org', 2)).map((u) => u.name),
        ['Ann'],
      );
      assert.equal((await people.activeWithEmail('bob@example.org', 2)).length, 2);
      assert.equal((await people.activeWithEmail('bob@example.org', 1)).length, 1);
      assert.deepEqual(await people.activeWithEmail('cy@example.org', 2), []);
    });
  });
}

answersAlike('in memory', async () =>
  inMemoryDirectory(PEOPLE.map((p, i): Person => ({ id: `u${i}`, roles: ['chair'], ...p }))),
);

for (const kind of databaseKinds()) {
  let close = async () => {};
  after(() => close());
  answersAlike(`users on ${kind}`, async () => {
    const { testDb, db } = await openMigratedDatabase(kind);
    close = async () => {
      await db.close();
      await testDb.drop();
    };
    for (const p of PEOPLE) {
      await createUser(db.knex, { name: p.name, roles: ['chair'], password: 'directory test 1' });
      await db.knex.transaction(async (trx) => {
        await setUserEmail(trx, p.name, p.email);
        if (p.disabled) await changeUser(trx, p.name, { disable: true });
      });
    }
    return createUserDirectory(db.knex);
  });
}

describe('who a Slack user is (on the twin, with a Slack stand-in that answers users.info)', () => {
  const people = inMemoryDirectory(PEOPLE.map((p, i): Person => ({ id: `u${i}`, roles: ['chair'], ...p })));
  const profiles: Record<string, string | undefined> = { U1: 'ann@example.org', U2: 'bob@example.org' };
  const api: Pick<SlackApi, 'call'> = {
    async call(method, args) {
      assert.equal(method, 'users.info');
      const user = String(args.user);
      if (user === 'UDOWN') throw new Error('Slack is unreachable');
      return { ok: true, user: { profile: { email: profiles[user] } } };
    },
  };
  const slack = { users: { UCONF: 'ann', UGONE: 'cy' } } as never;
  const map = (id: string) => mapSlackUser({ people, api, slack }, id);

  it('maps by the configured name first, then by the one user with the profile address', async () => {
    assert.equal(((await map('UCONF')) as { user: Person }).user.name, 'Ann');
    assert.equal(((await map('U1')) as { user: Person }).user.name, 'Ann');
  });

  it('maps nobody for a disabled user, an address two users share, or a profile without one', async () => {
    for (const id of ['UGONE', 'U2', 'U3']) {
      assert.equal(((await map(id)) as { refused?: string }).refused, 'unmapped_user', id);
    }
    assert.equal(((await map('U2')) as { email?: string }).email, 'bob@example.org');
  });

  it('says so when Slack cannot be asked', async () => {
    assert.equal(((await map('UDOWN')) as { refused?: string }).refused, 'lookup_failed');
  });
});
