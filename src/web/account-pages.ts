import type { NextFunction, Request, Response, Router } from 'express';
import type { Config } from '../config.ts';
import { Role } from '../core/identity.ts';
import {
  formOf,
  listOf,
  listUsers,
  newPassword,
  noticeOf,
  pathOf,
  runAs,
  showSecret,
  textOf,
  type AccountPages,
  type CommandInput,
  type Refusal,
  type RunCommand,
} from './account-kit.ts';
import { mountAgentPages } from './agent-pages.ts';
import type { PageKit } from './kit.ts';
import type { WebSession } from './sessions.ts';

/** Said before the command would say "roles: Too small": every user holds at least one role. */
const NO_ROLE = 'Choose at least one role.';

const USER_NOTICES = {
  roles: 'Roles saved. They hold from the user’s next page on.',
  email: 'E-mail address saved.',
  unchanged: 'Nothing to change.',
  disabled: 'User disabled: their sign-ins are refused and their web sessions have ended.',
};

/**
 * Accounts in the web UI, for admin users: the same commands as `countersign user …` and `agent …`, with
 * the same validation, refusals and audit rows, and the signed-in admin as their actor.
 */
export function mountAccountPages(
  router: Router,
  kit: PageKit,
  deps: { run: RunCommand; config: Config },
): void {
  const requireAdmin = (_req: Request, res: Response, next: NextFunction) => {
    if ((res.locals.session as WebSession).user.roles.includes('admin')) return next();
    kit.render(res, 403, 'error.njk', {
      title: 'Not allowed',
      message: 'Users and agents are managed by admin users.',
    });
  };
  const guard = [kit.requireUser, requireAdmin];
  const pages: AccountPages = { ...deps, kit, guard, form: [...guard, kit.requireCsrf] };
  router.get('/admin', ...guard, (_req, res) => res.redirect(303, '/admin/users'));
  mountUserList(router, pages);
  mountUserPage(router, pages);
  mountAgentPages(router, pages);
}

/** The list of users, and the form that adds one with a password shown once. */
function mountUserList(router: Router, pages: AccountPages): void {
  const showList = async (res: Response, status: number, extra: Record<string, unknown> = {}) =>
    pages.kit.render(res, status, 'users.njk', {
      users: await listUsers(pages.run),
      roles: Role.options,
      draft: { roles: [] },
      ...extra,
    });

  router.get('/admin/users', ...pages.guard, (_req, res) => showList(res, 200));

  router.post('/admin/users', ...pages.form, async (req, res) => {
    const body = formOf(req);
    const draft = { name: textOf(body.name), roles: listOf(body.role) };
    if (draft.roles.length === 0) return showList(res, 400, { error: NO_ROLE, draft });
    const password = newPassword();
    const input = { command: 'user.add', ...draft, password };
    const added = await runAs(pages, res, input, ({ status, message }) =>
      showList(res, status, { error: message, draft }),
    );
    if (!added) return;
    showSecret(pages, res, {
      title: `User ${draft.name} added`,
      label: `Initial password of ${draft.name}`,
      secret: password,
      advice: `Give it to ${draft.name} by a private channel; they sign in with it at /login.`,
      back: { href: pathOf('users', draft.name), text: `${draft.name}’s page` },
    });
  });
}

/** One user's page: roles, e-mail address, a new password shown once, disabling. */
function mountUserPage(router: Router, pages: AccountPages): void {
  const { kit } = pages;
  const find = async (name: string) => (await listUsers(pages.run)).find((u) => u.name === name);
  const showUser = async (
    res: Response,
    name: string,
    status: number,
    extra: Record<string, unknown> = {},
  ) => {
    const user = await find(name);
    if (!user)
      return kit.render(res, 404, 'error.njk', { title: 'Not found', message: `There is no user ${name}.` });
    kit.render(res, status, 'user.njk', { user, roles: Role.options, ...extra });
  };
  const refusedOn = (res: Response, name: string) => (r: Refusal) =>
    showUser(res, name, r.status, { error: r.message });
  /** Changes the user `name`; done, back to their page with a notice; refused, the page says why. */
  const change = async (res: Response, name: string, input: CommandInput, done: string) => {
    if (await runAs(pages, res, { ...input, name }, refusedOn(res, name)))
      res.redirect(303, `${pathOf('users', name)}?done=${done}`);
  };
  const unchanged = (res: Response, name: string) =>
    res.redirect(303, `${pathOf('users', name)}?done=unchanged`);

  router.get('/admin/users/:name', ...pages.guard, (req, res) =>
    showUser(res, String(req.params.name), 200, { notice: noticeOf(USER_NOTICES, req.query.done) }),
  );

  router.post('/admin/users/:name/roles', ...pages.form, async (req, res) => {
    const name = String(req.params.name);
    const roles = listOf(formOf(req).role);
    if (roles.length === 0) return showUser(res, name, 400, { error: NO_ROLE });
    // Saving the roles a user already has records nothing: the log keeps changes, not clicks.
    const user = await find(name);
    if (user && !user.disabled_at && sameSet(user.roles, roles)) return unchanged(res, name);
    await change(res, name, { command: 'user.set', roles }, 'roles');
  });

  router.post('/admin/users/:name/email', ...pages.form, async (req, res) => {
    const name = String(req.params.name);
    const email = textOf(formOf(req).email) || null;
    const user = await find(name);
    if (user && !user.disabled_at && user.email === email) return unchanged(res, name);
    await change(res, name, { command: 'user.set_email', email }, 'email');
  });

  router.post('/admin/users/:name/password', ...pages.form, async (req, res) => {
    const name = String(req.params.name);
    const password = newPassword();
    const input = { command: 'user.reset_password', name, password };
    if (!(await runAs(pages, res, input, refusedOn(res, name)))) return;
    showSecret(pages, res, {
      title: `Password of ${name} reset`,
      label: `New password of ${name}`,
      secret: password,
      advice:
        `The old password no longer works and ${name}’s web sessions have ended. ` +
        `Give the new one to ${name} by a private channel.`,
      back: { href: pathOf('users', name), text: `${name}’s page` },
    });
  });

  router.post('/admin/users/:name/disable', ...pages.form, (req, res) =>
    change(res, String(req.params.name), { command: 'user.disable' }, 'disabled'),
  );
}

const sameSet = (a: readonly string[], b: readonly string[]) =>
  new Set(a).size === new Set(b).size && a.every((x) => b.includes(x));
