import { randomBytes, randomUUID } from 'node:crypto';
import type { SessionStore, UserDirectory } from '../../src/accounts/index.ts';
import { AdminCommand, describeZodError } from '../../src/admin/commands.ts';
import { AppError } from '../../src/core/errors.ts';
import type { User } from '../../src/core/identity.ts';
import type { MemoryStore, Note } from '../../src/tools/memory/store.ts';

/** A person as the directory twin holds them: a user, their address if any, whether disabled. */
export interface Person extends User {
  email?: string;
  disabled?: boolean;
}

/**
 * The user directory's twin in memory (test/store/user-directory.test.ts holds it and the real one to the
 * same answers), for tests of what maps an outside identity to a user, with no database.
 */
export function inMemoryDirectory(people: Person[]): UserDirectory {
  const active = () => people.filter((p) => !p.disabled);
  const user = ({ id, name, roles }: Person): User => ({ id, name, roles });
  return {
    async activeNamed(name) {
      const found = active().filter((p) => p.name.toLowerCase() === name.toLowerCase());
      return found.length === 1 ? user(found[0]!) : undefined;
    },
    async activeWithEmail(email, limit) {
      return active()
        .filter((p) => p.email?.toLowerCase() === email.toLowerCase())
        .slice(0, limit)
        .map(user);
    },
  };
}

/** What the people twin holds of a user beyond the directory's view. */
interface Held extends Person {
  password: string;
  created_at: string;
  disabled_at: string | null;
}

/**
 * The accounts' twin in memory for the web pages: their session store and the `user.*` operator
 * commands the account pages run, over one set of people. test/store/people-twin.test.ts holds it and the real
 * ones (accounts/sessions.ts, admin/commands.ts on a database) to the same answers and refusals.
 */
export function inMemoryPeople(lifetime: { idleMs: number; absoluteMs: number }) {
  const people = new Map<string, Held>();
  const sessions = new Map<string, { user_id: string; csrf: string; created: number; seen: number }>();
  const active = (name: string) => {
    const held = people.get(name);
    if (!held || held.disabled_at)
      throw new AppError('NOT_FOUND', `no active user named "${name}"`, 'unknown_user');
    return held;
  };
  const endSessionsOf = (id: string) => {
    for (const [key, s] of sessions) if (s.user_id === id) sessions.delete(key);
  };
  const sessionStore: SessionStore = {
    async create(user) {
      const id = randomBytes(32).toString('base64url');
      const csrf = randomBytes(32).toString('base64url');
      sessions.set(id, { user_id: user.id, csrf, created: Date.now(), seen: Date.now() });
      return { id, csrf };
    },
    async load(id) {
      const s = id === undefined ? undefined : sessions.get(id);
      const held = s && [...people.values()].find((p) => p.id === s.user_id && !p.disabled_at);
      if (!s || !held) return undefined;
      const now = Date.now();
      if (now - s.seen > lifetime.idleMs || now - s.created > lifetime.absoluteMs) {
        sessions.delete(id!);
        return undefined;
      }
      s.seen = now;
      return { user: { id: held.id, name: held.name, roles: [...held.roles] }, csrf: s.csrf };
    },
    async destroy(id) {
      if (id) sessions.delete(id);
    },
  };
  const change = (name: string, next: Partial<Held>) => {
    const held = active(name);
    const losesAdmin =
      held.roles.includes('admin') &&
      (next.disabled_at !== undefined || (next.roles && !next.roles.includes('admin')));
    const admins = [...people.values()].filter(
      (p) => p !== held && !p.disabled_at && p.roles.includes('admin'),
    );
    if (losesAdmin && admins.length === 0)
      throw new AppError(
        'CONFLICT',
        `"${name}" is the last active admin: add another admin first`,
        'last_admin',
      );
    const before = held.roles;
    Object.assign(held, next);
    if (next.password !== undefined || next.disabled_at !== undefined) endSessionsOf(held.id);
    return { user: name, roles_before: before, roles: held.roles };
  };
  const run = async (input: { command: string; [field: string]: unknown }): Promise<unknown> => {
    const parsed = AdminCommand.safeParse(input);
    // As the web pages' runner (app/web-commands.ts): a refused input names the field.
    if (!parsed.success) throw new AppError('CONFIG_INVALID', describeZodError(parsed.error));
    const cmd = parsed.data;
    switch (cmd.command) {
      case 'user.list':
        return {
          users: [...people.values()]
            .sort((a, b) => (a.name < b.name ? -1 : 1))
            .map(({ name, roles, email, created_at, disabled_at }) => ({
              ...{ name, roles, email: email ?? null, created_at, disabled_at },
            })),
        };
      case 'user.add': {
        const taken = [...people.values()].find((p) => p.name.toLowerCase() === cmd.name.toLowerCase());
        if (taken) throw new AppError('CONFLICT', `a user named "${cmd.name}" already exists`, 'user_exists');
        const user = { id: randomUUID(), name: cmd.name, roles: [...new Set(cmd.roles)] };
        people.set(cmd.name, {
          ...user,
          password: cmd.password,
          created_at: new Date().toISOString(),
          disabled_at: null,
        });
        return { user };
      }
      case 'user.set':
        return pick(change(cmd.name, { roles: [...new Set(cmd.roles)] }), 'user', 'roles');
      case 'user.set_email': {
        const held = active(cmd.name);
        held.email = cmd.email?.trim() ?? undefined;
        return { user: cmd.name, email: held.email ?? null };
      }
      case 'user.reset_password':
        return pick(change(cmd.name, { password: cmd.password }), 'user', 'roles');
      case 'user.disable':
        return pick(change(cmd.name, { disabled_at: new Date().toISOString() }), 'user', 'roles');
      default:
        throw new AppError('INVALID_ARGUMENT', `the people twin runs user commands only, not ${cmd.command}`);
    }
  };
  return { sessions: sessionStore, run, people };
}

const pick = <T extends object, K extends keyof T>(o: T, ...keys: K[]) =>
  Object.fromEntries(keys.map((k) => [k, o[k]])) as Pick<T, K>;

/** The store's twin in memory, on the clock `now`: the same contract (test/store/memory-store.test.ts holds both to it). */
export function inMemoryNotes(now: () => Date = () => new Date()): MemoryStore {
  const notes = new Map<string, Note>();
  const keyOf = (agentId: string, sessionId: string, key: string) =>
    JSON.stringify([agentId, sessionId, key]);
  return {
    async remember(agentId, sessionId, key, value, ttlS) {
      const expires_at = new Date(now().getTime() + ttlS * 1000).toISOString();
      notes.set(keyOf(agentId, sessionId, key), { value, expires_at });
      return { expires_at };
    },
    async recall(agentId, sessionId, key) {
      const note = notes.get(keyOf(agentId, sessionId, key));
      return note && note.expires_at > now().toISOString() ? { ...note } : undefined;
    },
  };
}
