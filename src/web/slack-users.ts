import type { Knex } from 'knex';
import { z } from 'zod';
import { Role, type User } from '../core/identity.ts';
import type { SlackConfig } from '../config.ts';
import type { SlackApi } from '../notify/slack.ts';

/** How long the users.info look-up may take: Slack wants its callback answered within 3 s. */
const LOOKUP_MS = 1500;

const UsersInfo = z.object({
  user: z.object({ profile: z.object({ email: z.string().optional() }).optional() }),
});

const UserRow = z.object({
  id: z.string(),
  name: z.string(),
  roles: z
    .unknown()
    .transform((v) => (typeof v === 'string' ? (JSON.parse(v) as unknown) : v))
    .pipe(z.array(Role)),
});

export type SlackMapping =
  { user: User } | { refused: 'unmapped_user' | 'lookup_failed'; message: string; email?: string };

const UNMAPPED =
  'Your Slack account is not linked to a countersign user, so you cannot decide here. ' +
  'Ask an admin to map your Slack user id in notifications.slack.users, or to give your countersign ' +
  'user the e-mail address of your Slack profile.';

/**
 * The countersign user a Slack user acts as: the one `notifications.slack.users` names for their id,
 * else the one active user whose e-mail address is their Slack profile's (users.info, scope
 * users:read.email). A disabled user, an address no user or several users have, or a profile without
 * an address maps to nobody.
 */
export async function mapSlackUser(
  deps: { knex: Knex; api: SlackApi; slack: SlackConfig },
  slackUser: string,
): Promise<SlackMapping> {
  const active = () => deps.knex('users').select('id', 'name', 'roles').whereNull('disabled_at');
  const named = deps.slack.users[slackUser];
  let rows: unknown[];
  let email: string | undefined;
  if (named) {
    // The person the configured name names: user names are unique ignoring case.
    rows = (await active().whereRaw('lower(name) = lower(?)', [named])) as unknown[];
  } else {
    try {
      email = UsersInfo.parse(await deps.api.call('users.info', { user: slackUser }, LOOKUP_MS)).user.profile
        ?.email;
    } catch {
      return {
        refused: 'lookup_failed',
        message: 'countersign could not ask Slack who you are just now. Please try again.',
      };
    }
    rows = email ? ((await active().whereRaw('lower(email) = lower(?)', [email]).limit(2)) as unknown[]) : [];
  }
  if (rows.length !== 1) return { refused: 'unmapped_user', message: UNMAPPED, ...(email ? { email } : {}) };
  const row = UserRow.parse(rows[0]);
  return { user: { id: row.id, name: row.name, roles: row.roles } };
}
