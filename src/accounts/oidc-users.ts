import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import type { AuditLog } from '../audit/index.ts';
import type { OidcConfig } from '../config.ts';
import { Role, UserName, type User } from '../core/identity.ts';
import { claimAt, type OidcClaims, type OidcRefusal } from './oidc.ts';
import type { AuditKind } from '../core/audit-kinds.ts';
import type { HostRoots } from '../core/host-roots.ts';
import type { Connection, Transaction } from '../db/knex.ts';
import { sealAfterChange, sealUser, userSealed } from './authority.ts';
import type { UserRecord } from './store/index.ts';
import { sessions, users } from './store/index.ts';

/** Who the verified claims say the person is, in countersign's terms. */
export interface OidcIdentity {
  issuer: string;
  subject: string;
  /** The user name a first sign-in creates; undefined when no configured claim holds a valid one. */
  name: string | undefined;
  /** Every role the role claim's values map to, in a fixed order; empty when none does. */
  roles: Role[];
  /**
   * The e-mail address, when the provider vouches for it (`email_verified: true`; a missing claim is not
   * verified): recorded on a new user for notices, and what links the identity to an existing user.
   */
  email: string | undefined;
  /** The address the claims carry, verified or not: one that an existing user has refuses a first sign-in. */
  claimed_email: string | undefined;
}

/** Maps verified claims to a name, roles and e-mail address (config `web.oidc`). */
export function identityOf(config: OidcConfig, claims: OidcClaims): OidcIdentity {
  const raw = claimAt(claims, config.role_claim);
  const values = (Array.isArray(raw) ? raw : [raw]).filter((v): v is string => typeof v === 'string');
  const granted = new Set(values.flatMap((v) => (Object.hasOwn(config.roles, v) ? config.roles[v]! : [])));
  const name = config.username_claims
    .map((c) => claimAt(claims, c))
    .find((v): v is string => UserName.safeParse(v).success);
  const email = z.email().safeParse(claims.email);
  return {
    issuer: config.issuer,
    subject: claims.sub,
    name,
    roles: Role.options.filter((r) => granted.has(r)),
    email: email.success && claims.email_verified === true ? email.data : undefined,
    claimed_email: email.success ? email.data : undefined,
  };
}

const rolesOf = (raw: unknown) => z.array(Role).parse(typeof raw === 'string' ? JSON.parse(raw) : raw);

interface UserRow extends Partial<UserRecord> {
  id: string;
  name: string;
  roles: unknown;
  disabled_at: unknown;
  oidc_issuer: string | null;
  oidc_subject: string | null;
}

/**
 * On a first sign-in, the existing user the identity belongs to, by e-mail address: the one user with the
 * provider-verified address (locked, to be linked). Refused: an address that the provider does not vouch
 * for but a user here has (email_unverified), and a verified one that several users have or whose user
 * has another identity (email_in_use) — never linked by a guess. Undefined: no user has the address.
 */
async function userByEmail(
  trx: Transaction,
  identity: OidcIdentity,
): Promise<{ row: UserRow } | OidcRefusal | undefined> {
  const address = identity.email ?? identity.claimed_email;
  if (!address) return undefined;
  const rows: UserRow[] = await users.withEmailForUpdate(trx, address);
  if (rows.length === 0) return undefined;
  if (!identity.email) return { failure: 'email_unverified' };
  const [row] = rows;
  const other =
    row!.oidc_subject !== null &&
    (row!.oidc_issuer !== identity.issuer || row!.oidc_subject !== identity.subject);
  if (rows.length > 1 || other) return { failure: 'email_in_use' };
  return { row: row! };
}

/**
 * A user whose record this server did not seal as it stands (an identity remapped, roles or an address
 * set by SQL: authority.ts) is refused like a disabled one, and the refusal recorded with the sign-in.
 */
async function refuseTampered(audit: AuditLog, trx: Transaction, identity: OidcIdentity, row: UserRow) {
  await audit.appendIn(trx, {
    kind: 'user.record_tampered',
    actor: `oidc:${identity.issuer}`,
    result: 'error',
    error_code: 'TAMPERED',
    details: {
      user: row.name,
      where: 'sign_in_oidc',
      reason: 'user_record_tampered',
      subject: identity.subject,
    },
  });
  return { failure: 'tampered' as const, name: row.name };
}

/** A new user for a first sign-in, sealed; any unique index may refuse it (then nothing is inserted). */
function insertUser(trx: Transaction, roots: HostRoots, identity: OidcIdentity, user: User) {
  const record = {
    ...user,
    password_hash: null,
    oidc_issuer: identity.issuer,
    oidc_subject: identity.subject,
    email: identity.email ?? null,
  };
  // The name (taken), or this identity (created meanwhile by a racing sign-in).
  return users.insert(trx, {
    ...record,
    roles: JSON.stringify(user.roles),
    authority_mac: sealUser(roots, { ...record, teams: [], disabled_at: null }),
  });
}

/**
 * The user behind a verified identity, found by (issuer, subject) and never by name alone. On the person's
 * first sign-in: linked to the existing user whose e-mail address the provider verified (user.linked), else
 * created (user.created); its roles brought in line with the claims at every sign-in (user.role_changed);
 * each audited with the provider as actor and committed with its change. Refused: no role, a disabled user,
 * no usable name, a name another account holds ignoring case (a local account is never taken over), or an
 * address of an existing user that the provider does not vouch for. The refusal names the user when there
 * is one.
 */
export async function signInWithOidc(
  deps: { knex: Connection; audit: AuditLog; roots: HostRoots },
  identity: OidcIdentity,
): Promise<{ user: User } | (OidcRefusal & { name?: string })> {
  const { roots } = deps;
  const tampered = (trx: Transaction, row: UserRow) => refuseTampered(deps.audit, trx, identity, row);
  const actor = `oidc:${identity.issuer}`;
  const facts = { via: 'oidc', issuer: identity.issuer, subject: identity.subject };
  // A change's row, committed with it; the user's record is sealed again binding its seq.
  const changed = async (trx: Transaction, kind: AuditKind, details: Record<string, unknown>) => {
    const [row] = await deps.audit.appendIn(trx, { kind, actor, result: 'ok', details });
    await sealAfterChange(trx, roots, row!);
  };
  const bySubject = (trx: Transaction): Promise<UserRow | undefined> =>
    users.withIdentityForUpdate(trx, identity.issuer, identity.subject);

  return deps.knex.transaction(async (trx) => {
    let row = await bySubject(trx);
    // A disabled user is refused as disabled whatever else its record says; an enabled one must be sealed.
    if (row && row.disabled_at === null && !userSealed(roots, row)) return tampered(trx, row);
    if (!row) {
      if (identity.roles.length === 0) return { failure: 'no_role', name: identity.name };
      const byEmail = await userByEmail(trx, identity);
      if (byEmail && 'failure' in byEmail) return { ...byEmail, name: identity.name };
      if (byEmail) {
        row = byEmail.row;
        if (row.disabled_at !== null) return { failure: 'disabled', name: row.name };
        if (!userSealed(roots, row)) return tampered(trx, row);
        if (row.oidc_subject === null) {
          const linked = { oidc_issuer: identity.issuer, oidc_subject: identity.subject };
          await users.update(trx, row.id, {
            ...linked,
            authority_mac: sealUser(roots, { ...row, ...linked }),
          });
          row = { ...row, ...linked };
          const details = { user: row.name, email: identity.email ?? null, ...facts };
          await changed(trx, 'user.linked', details);
        }
      }
    }
    if (!row) {
      if (!identity.name) return { failure: 'no_username' };
      const user: User = { id: randomUUID(), name: identity.name, roles: identity.roles };
      const inserted = await insertUser(trx, roots, identity, user);
      if (inserted.length === 1) {
        const details = { user: user.name, roles: user.roles, email: identity.email ?? null, ...facts };
        await changed(trx, 'user.created', details);
        return { user };
      }
      row = await bySubject(trx);
      if (!row) return { failure: 'name_taken', name: identity.name };
      if (row.disabled_at === null && !userSealed(roots, row)) return tampered(trx, row);
    }
    if (row.disabled_at !== null) return { failure: 'disabled', name: row.name };
    if (identity.roles.length === 0) {
      // The provider no longer grants a role: whatever session the person still holds ends too.
      await sessions.removeOfUser(trx, row.id);
      return { failure: 'no_role', name: row.name };
    }
    const before = rolesOf(row.roles);
    if (Role.options.filter((r) => before.includes(r)).join() !== identity.roles.join()) {
      await users.update(trx, row.id, {
        roles: JSON.stringify(identity.roles),
        authority_mac: sealUser(roots, { ...row, roles: identity.roles }),
      });
      await changed(trx, 'user.role_changed', {
        user: row.name,
        roles_before: before,
        roles_after: identity.roles,
        ...facts,
      });
    }
    return { user: { id: row.id, name: row.name, roles: identity.roles } };
  });
}
