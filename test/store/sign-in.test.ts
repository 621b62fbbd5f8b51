import path from 'node:path';
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createSignIn, REFUSED_RECHECK_MS, type SignIn } from '../../src/accounts/sign-in.ts';
import { createAuditLog, type AuditLog } from '../../src/audit/log.ts';
import type { Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';
import { lazyHostRoots } from '../../src/db/host-roots.ts';
import type { HostRoots } from '../../src/core/host-roots.ts';

/**
 * The sign-in the web pages and the command line are given: the configured limits travel with it, so
 * that a caller names only the bucket and the origin. The limits under concurrency and through HTTP are
 * test/e2e/signin-limits.test.ts's; these pin what the object adds.
 */
for (const kind of databaseKinds()) {
  describe(`the sign-in service on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    let audit: AuditLog;
    let signIn: SignIn;
    let roots: () => Promise<HostRoots>;

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
      audit = createAuditLog(db.knex);
      roots = lazyHostRoots(db.knex, path.join(testDb.dataDir, 'host-roots.json'));
      signIn = createSignIn({ knex: db.knex, audit, roots, limits: { perUser: 1, perIp: 3 } });
    });
    after(async () => {
      await audit.drain();
      await db.close();
      await testDb.drop();
    });

    it('reserves single sign-on callbacks per origin under the per-address limit, not the per-user one', async () => {
      const ids = [];
      for (let i = 0; i < 3; i++)
        ids.push(await signIn.reserve({ bucket: 'oidc_callback', origin: '10.0.0.1' }));
      assert.ok(ids.every((id) => typeof id === 'number'));
      assert.equal(await signIn.reserve({ bucket: 'oidc_callback', origin: '10.0.0.1' }), undefined);
      // Another bucket, another address: counted apart.
      assert.equal(typeof (await signIn.reserve({ bucket: 'password', origin: '10.0.0.1' })), 'number');
      assert.equal(typeof (await signIn.reserve({ bucket: 'oidc_callback', origin: '10.0.0.2' })), 'number');
      // A released attempt no longer counts.
      await signIn.release(ids[0]!);
      assert.equal(typeof (await signIn.reserve({ bucket: 'oidc_callback', origin: '10.0.0.1' })), 'number');
    });

    it('refuses a locked-out origin from memory for a second, then asks the database again', async () => {
      let statements = 0;
      const count = () => statements++;
      db.knex.on('query', count);
      try {
        const origin = '10.0.1.1';
        const ids = [];
        for (let i = 0; i < 3; i++) ids.push(await signIn.reserve({ bucket: 'oidc_callback', origin }));
        assert.equal(await signIn.reserve({ bucket: 'oidc_callback', origin }), undefined);
        // A flood at the locked-out address: refused without a statement.
        const before = statements;
        for (let i = 0; i < 200; i++)
          assert.equal(await signIn.reserve({ bucket: 'oidc_callback', origin }), undefined);
        assert.equal(statements - before, 0);
        // Only that origin, and only that bucket, is refused unasked.
        assert.equal(typeof (await signIn.reserve({ bucket: 'password', origin })), 'number');
        assert.ok(statements > before);
        // Another process (replica) on the same database gives an attempt back: this one learns of it
        // when it asks again, a second later at most.
        const other = createSignIn({ knex: db.knex, audit, roots, limits: { perUser: 1, perIp: 3 } });
        await other.release(ids[0]!);
        assert.equal(await signIn.reserve({ bucket: 'oidc_callback', origin }), undefined);
        await new Promise((resolve) => setTimeout(resolve, REFUSED_RECHECK_MS + 50));
        assert.equal(typeof (await signIn.reserve({ bucket: 'oidc_callback', origin })), 'number');
        // Locked out again; an attempt given back on this process ends the memory at once.
        assert.equal(await signIn.reserve({ bucket: 'oidc_callback', origin }), undefined);
        await signIn.release(ids[1]!);
        assert.equal(typeof (await signIn.reserve({ bucket: 'oidc_callback', origin })), 'number');
      } finally {
        db.knex.off('query', count);
      }
    });

    it('refuses a locked-out user name from memory, from any origin, and not other names', async () => {
      const name = 'memo';
      assert.deepEqual(await signIn.signIn({ name, password: 'x', origin: '10.0.2.1', via: 'web' }), {
        refused: 'wrong_password',
      });
      let statements = 0;
      const count = () => statements++;
      db.knex.on('query', count);
      try {
        assert.deepEqual(await signIn.signIn({ name, password: 'x', origin: '10.0.2.2', via: 'web' }), {
          refused: 'locked_out',
        });
        const before = statements;
        assert.deepEqual(await signIn.signIn({ name, password: 'x', origin: '10.0.2.3', via: 'web' }), {
          refused: 'locked_out',
        });
        assert.equal(statements - before, 0);
        assert.deepEqual(
          await signIn.signIn({ name: 'other', password: 'x', origin: '10.0.2.3', via: 'web' }),
          {
            refused: 'wrong_password',
          },
        );
      } finally {
        db.knex.off('query', count);
      }
    });

    it('holds a password attempt to the per-user limit', async () => {
      assert.deepEqual(
        await signIn.signIn({ name: 'nobody', password: 'x', origin: '10.0.0.9', via: 'cli' }),
        {
          refused: 'wrong_password',
        },
      );
      assert.deepEqual(
        await signIn.signIn({ name: 'nobody', password: 'x', origin: '10.0.0.8', via: 'cli' }),
        {
          refused: 'locked_out',
        },
      );
    });

    it('seals single sign-on attempts with one secret for every replica sharing the host roots', async () => {
      const secret = await signIn.oidcAttemptSecret();
      assert.match(secret, /^[\w-]{43}$/);
      const another = createSignIn({ knex: db.knex, audit, roots, limits: { perUser: 5, perIp: 5 } });
      assert.equal(await another.oidcAttemptSecret(), secret);
      assert.equal(await signIn.oidcAttemptSecret(), secret);
    });
  });
}
