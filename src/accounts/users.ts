import {
  randomBytes,
  randomUUID,
  scrypt as scryptCb,
  timingSafeEqual,
  type ScryptOptions,
} from 'node:crypto';
import type { Knex } from 'knex';
import { z } from 'zod';
import { AppError } from '../core/errors.ts';
import { Role, UserName, type User } from '../core/identity.ts';

const scrypt = (password: string, salt: Buffer, keylen: number, opts: ScryptOptions) =>
  new Promise<Buffer>((resolve, reject) =>
    scryptCb(password, salt, keylen, opts, (err, key) => (err ? reject(err) : resolve(key))),
  );

const PARAMS = { N: 16384, r: 8, p: 1 };

/** `scrypt$N$r$p$salt$hash`, base64url; parameters travel with the hash so they can be raised later. */
export async function hashPassword(password: string): Promise<string> {
  const salt = randomBytes(16);
  const key = await scrypt(password, salt, 32, PARAMS);
  return ['scrypt', PARAMS.N, PARAMS.r, PARAMS.p, salt.toString('base64url'), key.toString('base64url')].join(
    '$',
  );
}

export async function verifyPassword(password: string, stored: string): Promise<boolean> {
  const [scheme, n, r, p, salt, hash] = stored.split('$');
  if (scheme !== 'scrypt' || !salt || !hash) return false;
  const expected = Buffer.from(hash, 'base64url');
  const key = await scrypt(password, Buffer.from(salt, 'base64url'), expected.length, {
    N: Number(n),
    r: Number(r),
    p: Number(p),
    maxmem: 256 * Number(n) * Number(r),
  });
  return timingSafeEqual(key, expected);
}

export async function createUser(
  knex: Knex,
  opts: { name: string; roles: Role[]; password: string },
): Promise<User> {
  const name = UserName.parse(opts.name);
  const roles = z
    .array(Role)
    .min(1)
    .parse([...new Set(opts.roles)]);
  z.object({ password: z.string().min(8, 'at least 8 characters') }).parse({ password: opts.password });
  const user: User = { id: randomUUID(), name, roles };
  const inserted = await knex('users')
    .insert({ ...user, roles: JSON.stringify(roles), password_hash: await hashPassword(opts.password) })
    .onConflict('name')
    .ignore()
    .returning('id');
  if (inserted.length === 0)
    throw new AppError('CONFLICT', `a user named "${name}" already exists`, 'user_exists');
  return user;
}

/** The user, if the name exists, is enabled and the password matches. Always spends one scrypt. */
export async function checkCredentials(
  knex: Knex,
  name: string,
  password: string,
): Promise<User | undefined> {
  const row = (await knex('users').where({ name }).whereNull('disabled_at').first()) as
    { id: string; name: string; roles: unknown; password_hash: string } | undefined;
  // Hash even for an unknown name, so timing does not tell which names exist.
  const ok = await verifyPassword(
    password,
    row?.password_hash ?? 'scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA$' + 'A'.repeat(43),
  );
  if (!row || !ok) return undefined;
  const roles = typeof row.roles === 'string' ? JSON.parse(row.roles) : row.roles;
  return { id: row.id, name: row.name, roles: z.array(Role).parse(roles) };
}
