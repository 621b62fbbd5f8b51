import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { detailsOf } from '../helpers/audit-rows.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';

for (const kind of databaseKinds()) {
  describe(`countersign user list, set, reset-password and disable on ${kind}`, () => {
    let server: TestServer;
    const cli = (args: string[], input?: string) =>
      runCli(args, server.env, input === undefined ? {} : { input });
    /** Signs in at the CLI as `name` (approvals list needs a chair): the exit code says whether it worked. */
    const signIn = (name: string, password: string) =>
      runCli(['approvals', 'list', '--as', name], { ...server.env, COUNTERSIGN_PASSWORD: password });
    const rows = (kind: string) => server.sql('audit_events').where({ kind }).orderBy('seq');

    before(async () => {
      server = await startTestServer(kind);
      assert.equal((await cli(['user', 'add', 'ada', '--role', 'admin'], 'ada-password-1\n')).code, 0);
      assert.equal((await cli(['user', 'add', 'cleo', '--role', 'chair'], 'cleo-password-1\n')).code, 0);
      // The first run's admin stands aside: the cases below are about ada being the last active admin.
      assert.equal((await cli(['user', 'disable', 'admin'])).code, 0);
    });
    const disabledRows = async (user: string) =>
      (await rows('user.disabled')).filter((r: { details: unknown }) => detailsOf(r).user === user);
    after(async () => {
      await server?.stop();
    });

    it('lists users with their roles and state, never a password hash', async () => {
      const listed = await cli(['user', 'list']);
      assert.equal(listed.code, 0, listed.stderr);
      assert.match(listed.stdout, /^ada\tadmin\tactive$/m);
      assert.match(listed.stdout, /^cleo\tchair\tactive$/m);
      assert.doesNotMatch(listed.stdout, /scrypt/);
    });

    it('changes roles with an audit row saying before and after, by whom', async () => {
      const set = await cli(['user', 'set', 'cleo', '--role', 'chair,compliance']);
      assert.equal(set.code, 0, set.stderr);
      assert.match(set.stdout, /now has roles chair, compliance/);
      const [row] = await rows('user.role_changed');
      assert.ok(row);
      assert.match(row.actor, /^cli:.+@.+/);
      assert.deepEqual(detailsOf(row), {
        user: 'cleo',
        roles_before: ['chair'],
        roles_after: ['chair', 'compliance'],
      });
      assert.equal((await cli(['user', 'set', 'cleo', '--role', 'emperor'])).code, 2, 'an unknown role');
    });

    it('resets a password: the old one stops working, the new one works, nothing secret recorded', async () => {
      assert.equal((await signIn('cleo', 'cleo-password-1')).code, 0);
      const reset = await cli(['user', 'reset-password', 'cleo'], 'cleo-password-2\n');
      assert.equal(reset.code, 0, reset.stderr);
      assert.equal((await signIn('cleo', 'cleo-password-1')).code, 1);
      assert.equal((await signIn('cleo', 'cleo-password-2')).code, 0);
      const [row] = await rows('user.password_reset');
      assert.deepEqual(detailsOf(row), { user: 'cleo' });
      assert.equal((await cli(['user', 'reset-password', 'cleo'], 'short\n')).code, 1, 'a short password');
    });

    it('never leaves the server without an active admin', async () => {
      for (const args of [
        ['user', 'disable', 'ada'],
        ['user', 'set', 'ada', '--role', 'chair'],
      ]) {
        const refused = await cli(args);
        assert.equal(refused.code, 1, args.join(' '));
        assert.match(refused.stderr, /last active admin/);
      }
      assert.equal((await disabledRows('ada')).length, 0);
      assert.equal((await cli(['user', 'add', 'bo', '--role', 'admin'], 'bo-password-11\n')).code, 0);
      assert.equal(
        (await cli(['user', 'set', 'ada', '--role', 'chair'])).code,
        0,
        'another admin exists now',
      );
    });

    it('disables a user: sign-in refused at once, listed as disabled; unknown names refused', async () => {
      const disabled = await cli(['user', 'disable', 'cleo']);
      assert.equal(disabled.code, 0, disabled.stderr);
      assert.equal((await signIn('cleo', 'cleo-password-2')).code, 1);
      assert.match((await cli(['user', 'list'])).stdout, /^cleo\tchair,compliance\tdisabled \d{4}-/m);
      assert.equal((await disabledRows('cleo')).length, 1);
      for (const args of [
        ['user', 'disable', 'cleo'],
        ['user', 'disable', 'nobody'],
        ['user', 'set', 'nobody', '--role', 'chair'],
      ]) {
        const refused = await cli(args);
        assert.equal(refused.code, 1, args.join(' '));
        assert.match(refused.stderr, /no active user named/);
      }
    });
  });
}
