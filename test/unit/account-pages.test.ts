import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import express from 'express';
import { loadConfig } from '../../src/config.ts';
import type { User } from '../../src/core/identity.ts';
import { mountAccountPages } from '../../src/web/account-pages.ts';
import { createPageKit } from '../../src/web/kit.ts';
import { loadSession, SESSION_COOKIE } from '../../src/web/sessions.ts';
import { inMemoryPeople } from '../helpers/twins.ts';

/**
 * The users pages alone, on a bare router over the accounts' twin (test/store/people-twin.test.ts holds it to
 * the real stores' answers): no server, no database. What the pages decide — who may see them, the
 * CSRF token, what a refusal shows, a password shown once — is all theirs.
 */
describe('the users pages, on the accounts twin', () => {
  const twin = inMemoryPeople({ idleMs: 60_000, absoluteMs: 3_600_000 });
  let base: string;
  let close: () => Promise<void>;
  let admin: { id: string; csrf: string };
  let chair: { id: string; csrf: string };

  before(async () => {
    const router = express.Router();
    router.use(express.urlencoded({ extended: false }));
    router.use(loadSession(twin.sessions));
    mountAccountPages(router, createPageKit(), {
      run: twin.run,
      config: loadConfig({}, fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-pages-'))),
    });
    const app = express().use(router);
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    close = () => new Promise((resolve) => server.close(() => resolve()));
    const add = async (name: string, roles: User['roles']) =>
      (
        (await twin.run({ command: 'user.add', name, roles, password: `${name} password`, actor: 't' })) as {
          user: User;
        }
      ).user;
    admin = await twin.sessions.create(await add('ann', ['admin']));
    chair = await twin.sessions.create(await add('bob', ['chair']));
  });
  after(() => close());

  const get = (path: string, session?: { id: string }) =>
    fetch(`${base}${path}`, {
      redirect: 'manual',
      headers: session ? { cookie: `${SESSION_COOKIE}=${session.id}` } : {},
    });
  const post = (path: string, session: { id: string }, form: Record<string, string | string[]>) => {
    const body = new URLSearchParams();
    for (const [k, v] of Object.entries(form)) for (const one of [v].flat()) body.append(k, one);
    return fetch(`${base}${path}`, {
      method: 'POST',
      redirect: 'manual',
      headers: {
        cookie: `${SESSION_COOKIE}=${session.id}`,
        'content-type': 'application/x-www-form-urlencoded',
      },
      body,
    });
  };

  it('sends a visitor to sign in, refuses a chair, and shows an admin every user, never cached', async () => {
    const visitor = await get('/admin/users');
    assert.equal(visitor.status, 303);
    assert.equal(visitor.headers.get('location'), '/login?next=%2Fadmin%2Fusers');
    const refused = await get('/admin/users', chair);
    assert.equal(refused.status, 403);
    assert.match(await refused.text(), /managed by admin users/);
    const page = await get('/admin/users', admin);
    assert.equal(page.status, 200);
    assert.equal(page.headers.get('cache-control'), 'no-store');
    const html = await page.text();
    assert.match(html, /href="\/admin\/users\/ann"/);
    assert.match(html, /href="\/admin\/users\/bob"/);
  });

  it('adds a user only with the session’s CSRF token, and shows the initial password once', async () => {
    const forged = await post('/admin/users', admin, { name: 'cy', role: 'chair', _csrf: chair.csrf });
    assert.equal(forged.status, 403);
    assert.match(await forged.text(), /Form expired/);
    assert.equal(twin.people.has('cy'), false);

    const added = await post('/admin/users', admin, {
      name: 'cy',
      role: ['chair', 'compliance'],
      _csrf: admin.csrf,
    });
    assert.equal(added.status, 200);
    const html = await added.text();
    const cy = twin.people.get('cy');
    assert.deepEqual(cy?.roles, ['chair', 'compliance']);
    assert.ok(html.includes(cy.password), 'the page shows the password the command set');
    assert.equal(added.headers.get('cache-control'), 'no-store');
    const list = await (await get('/admin/users', admin)).text();
    assert.ok(!list.includes(cy.password), 'and the list never shows it again');
  });

  it('shows a refusal on the page with its status, and changes nothing', async () => {
    const noRole = await post('/admin/users/ann/roles', admin, { _csrf: admin.csrf });
    assert.equal(noRole.status, 400);
    assert.match(await noRole.text(), /Choose at least one role/);
    const lastAdmin = await post('/admin/users/ann/roles', admin, { role: 'chair', _csrf: admin.csrf });
    assert.equal(lastAdmin.status, 409);
    assert.match(await lastAdmin.text(), /last active admin/);
    assert.deepEqual(twin.people.get('ann')?.roles, ['admin']);
  });

  it('saves roles and says so; a reset of one’s own password ends one’s own session', async () => {
    const saved = await post('/admin/users/bob/roles', admin, {
      role: ['chair', 'admin'],
      _csrf: admin.csrf,
    });
    assert.equal(saved.status, 303);
    assert.equal(saved.headers.get('location'), '/admin/users/bob?done=roles');
    assert.match(await (await get('/admin/users/bob?done=roles', admin)).text(), /Roles saved/);
    const reset = await post('/admin/users/ann/password', admin, { _csrf: admin.csrf });
    assert.equal(reset.status, 200);
    assert.ok((await reset.text()).includes(twin.people.get('ann')!.password));
    assert.equal((await get('/admin/users', admin)).status, 303, 'signed out by the reset');
  });
});
