import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { z } from 'zod';
import type { AuditLog } from '../audit/log.ts';
import type { OidcConfig } from '../config.ts';
import { Role, UserName, type User } from '../core/identity.ts';
import { claimAt, type OidcClaims, type OidcRefusal } from './oidc.ts';

/** Who the verified claims say the person is, in countersign's terms. */
export interface OidcIdentity {
  issuer: string;
  subject: string;
  /** The user name a first sign-in creates; undefined when no configured claim holds a valid one. */
  name: string | undefined;
  /** Every role the role claim's values map to, in a fixed order; empty when none does. */
  roles: Role[];
  /** A verified e-mail address, recorded on the new user for notices. */
  email: string | undefined;
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
    email: email.success && claims.email_verified !== false ? email.data : undefined,
  };
}

const rolesOf = (raw: unknown) => z.array(Role).parse(typeof raw === 'string' ? JSON.parse(raw) : raw);

interface UserRow {
  id: string;
  name: string;
  roles: unknown;
  disabled_at: unknown;
}

/**
 * The user behind a verified identity, found by (issuer, subject) and never by name alone: created on the
 * person's first sign-in (user.created), its roles brought in line with the claims on every later one
 * (user.role_changed), each audited with the provider as actor and committed with its change. Refused:
 * no role, a disabled user, no usable name, or a name another account holds (a local account is never
 * taken over). The refusal names the user when there is one.
 */
export async function signInWithOidc(
  deps: { knex: Knex; audit: AuditLog },
  identity: OidcIdentity,
): Promise<{ user: User } | (OidcRefusal & { name?: string })> {
  const actor = `oidc:${identity.issuer}`;
  const facts = { via: 'oidc', issuer: identity.issuer, subject: identity.subject };
  const bySubject = (trx: Knex.Transaction) =>
    trx('users')
      .where({ oidc_issuer: identity.issuer, oidc_subject: identity.subject })
      .forUpdate()
      .first() as Promise<UserRow | undefined>;

  return deps.knex.transaction(async (trx) => {
    let row = await bySubject(trx);
    if (!row) {
      if (identity.roles.length === 0) return { failure: 'no_role', name: identity.name };
      if (!identity.name) return { failure: 'no_username' };
      const user: User = { id: randomUUID(), name: identity.name, roles: identity.roles };
      // Any unique index may refuse: the name (taken), or this identity (created meanwhile by a racing sign-in).
      const inserted = await trx('users')
        .insert({
          ...user,
          roles: JSON.stringify(user.roles),
          password_hash: null,
          oidc_issuer: identity.issuer,
          oidc_subject: identity.subject,
          email: identity.email ?? null,
        })
        .onConflict()
        .ignore()
        .returning('id');
      if (inserted.length === 1) {
        const details = { user: user.name, roles: user.roles, email: identity.email ?? null, ...facts };
        await deps.audit.appendIn(trx, { kind: 'user.created', actor, result: 'ok', details });
        return { user };
      }
      row = await bySubject(trx);
      if (!row) return { failure: 'name_taken', name: identity.name };
    }
    if (row.disabled_at !== null) return { failure: 'disabled', name: row.name };
    if (identity.roles.length === 0) {
      // The provider no longer grants a role: whatever session the person still holds ends too.
      await trx('web_sessions').where({ user_id: row.id }).delete();
      return { failure: 'no_role', name: row.name };
    }
    const before = rolesOf(row.roles);
    if (Role.options.filter((r) => before.includes(r)).join() !== identity.roles.join()) {
      await trx('users')
        .where({ id: row.id })
        .update({ roles: JSON.stringify(identity.roles) });
      await deps.audit.appendIn(trx, {
        kind: 'user.role_changed',
        actor,
        result: 'ok',
        details: { user: row.name, roles_before: before, roles_after: identity.roles, ...facts },
      });
    }
    return { user: { id: row.id, name: row.name, roles: identity.roles } };
  });
}
