import type { UserDirectory } from '../../src/accounts/index.ts';
import type { User } from '../../src/core/identity.ts';

/** A person as the directory twin holds them: a user, their address if any, whether disabled. */
export interface Person extends User {
  email?: string;
  disabled?: boolean;
}

/**
 * The user directory's twin in memory (test/user-directory.test.ts holds it and the real one to the
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
