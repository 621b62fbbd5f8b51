import { z } from 'zod';
import type { UserDirectory } from '../accounts/index.ts';
import type { User } from '../core/identity.ts';
import type { SlackConfig } from '../config.ts';
import type { SlackApi } from '../notify/index.ts';

/** How long the users.info look-up may take: Slack wants its callback answered within 3 s. */
const LOOKUP_MS = 1500;

const UsersInfo = z.object({
  user: z.object({ profile: z.object({ email: z.string().optional() }).optional() }),
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
  deps: { people: UserDirectory; api: Pick<SlackApi, 'call'>; slack: SlackConfig },
  slackUser: string,
): Promise<SlackMapping> {
  const named = deps.slack.users[slackUser];
  let users: User[];
  let email: string | undefined;
  if (named) {
    // The person the configured name names: user names are unique ignoring case.
    const user = await deps.people.activeNamed(named);
    users = user ? [user] : [];
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
    // Two are enough to tell one person from several.
    users = email ? await deps.people.activeWithEmail(email, 2) : [];
  }
  if (users.length !== 1) return { refused: 'unmapped_user', message: UNMAPPED, ...(email ? { email } : {}) };
  return { user: users[0]! };
}
