import type { Command } from 'commander';
import { roles } from '../admin/cli-input.ts';
import type { Role } from '../core/identity.ts';
import { cliActor, config, out, readSecretLine, tampered, usageError } from './io.ts';
import { addResealCommand } from './reseal.ts';
import { runData } from './run-data.ts';

/** The people's commands (docs/identity.md): roles, teams, e-mail, passwords, single sign-on, seals. */

/** `user add|list|set|reset-password|disable|reseal|link`. */
export function addUserCommands(cli: Command): void {
  const user = cli
    .command('user')
    .description('manage people: chairs decide, compliance reviews, admins administer');
  user
    .command('add')
    .argument('<name>')
    .requiredOption('--role <roles>', 'chair, compliance or admin (comma-separated for several)', roles)
    .description('create a user; the password is read from stdin (first line)')
    .action(async (name: string, opts: { role: Role[] }) => {
      const password = await readSecretLine('password for the new user: ');
      const { user: created } = await runData(config(), {
        command: 'user.add',
        actor: cliActor(),
        name,
        roles: opts.role,
        password,
      });
      out(`user "${created.name}" created with roles ${created.roles.join(', ')}`);
    });
  user
    .command('list')
    .description('list users: name, roles, active or disabled')
    .action(async () => {
      const { users } = await runData(config(), { command: 'user.list' });
      for (const u of users) {
        const state = u.disabled_at ? `disabled ${u.disabled_at}` : 'active';
        const roles = [...u.roles, ...u.teams].join(',');
        out(`${u.name}\t${roles}\t${state}${u.email ? `\t${u.email}` : ''}${tampered(u)}`);
      }
    });
  addUserSet(user);
  user
    .command('reset-password')
    .argument('<name>')
    .description("set a user's password, read from stdin (first line); their web sessions end")
    .action(async (name: string) => {
      const password = await readSecretLine(`new password for ${name}: `);
      await runData(config(), { command: 'user.reset_password', name, password, actor: cliActor() });
      out(`password of user "${name}" reset; their web sessions have ended`);
    });
  user
    .command('disable')
    .argument('<name>')
    .description('disable a user: sign-ins are refused and sessions end at once (not the last active admin)')
    .action(async (name: string) => {
      await runData(config(), { command: 'user.disable', name, actor: cliActor() });
      out(`user "${name}" disabled`);
    });
  addResealCommand(user, 'user', 'roles, teams, e-mail, password and identity');
  addUserLinkCommand(user);
}

/** `user link`: a single sign-on identity signs in as an existing user from then on. */
function addUserLinkCommand(user: Command): void {
  user
    .command('link')
    .argument('<name>', 'an existing user')
    .requiredOption('--subject <sub>', "the person's subject (sub) at the single sign-on provider")
    .option('--issuer <url>', 'the provider (default: web.oidc.issuer)')
    .description(
      'link a single sign-on identity to an existing user: it signs in as that user from then on (audited)',
    )
    .action(async (name: string, opts: { subject: string; issuer?: string }) => {
      const result = await runData(config(), {
        command: 'user.link',
        name,
        subject: opts.subject,
        issuer: opts.issuer,
        actor: cliActor(),
      });
      const what = `${result.issuer} subject ${result.subject}`;
      out(
        result.unchanged
          ? `user "${result.user}" is already linked to ${what}`
          : `user "${result.user}" linked to ${what}`,
      );
    });
}

/** `user set`: roles, teams and e-mail address, each its own audited change. */
function addUserSet(user: Command): void {
  user
    .command('set')
    .argument('<name>')
    .option('--role <roles>', 'the new roles: chair, compliance, admin (comma-separated)', roles)
    .option('--email <address>', 'where notices of requests reach this chair ("none" clears it)')
    .option('--team <teams>', 'the teams approval rules may ask for, e.g. finance,legal ("none" clears them)')
    .description("change a user's roles (the last active admin keeps admin), teams or e-mail address")
    .action(async (name: string, opts: { role?: Role[]; email?: string; team?: string }) => {
      if (!opts.role && opts.email === undefined && opts.team === undefined)
        throw usageError('give --role, --team or --email');
      if (opts.role) {
        const result = await runData(config(), {
          command: 'user.set',
          name,
          roles: opts.role,
          actor: cliActor(),
        });
        out(`user "${result.user}" now has roles ${result.roles.join(', ')}`);
      }
      if (opts.team !== undefined) {
        const teams = opts.team === 'none' ? [] : opts.team.split(',').map((t) => t.trim());
        const result = await runData(config(), { command: 'user.set_teams', name, teams, actor: cliActor() });
        out(
          `user "${result.user}" is now in ${result.teams.length ? `teams ${result.teams.join(', ')}` : 'no team'}`,
        );
      }
      if (opts.email !== undefined) {
        const email = opts.email === 'none' ? null : opts.email;
        const result = await runData(config(), { command: 'user.set_email', name, email, actor: cliActor() });
        const now = result.email ? `now has e-mail ${result.email}` : 'has no e-mail address';
        out(`user "${result.user}" ${now}`);
      }
    });
}
