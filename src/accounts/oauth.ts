import type { Queryable } from '../db/knex.ts';
import { createRemoteJWKSet, decodeProtectedHeader, errors, jwtVerify, type JWTVerifyGetKey } from 'jose';
import { z } from 'zod';
import type { OAuthConfig } from '../config.ts';
import type { Agent } from '../core/identity.ts';
import { agentRow } from './agents.ts';
import type { Logger } from '../log.ts';

/**
 * Why an OAuth access token was refused; each is the `reason` of its 401 and of its auth.denied row.
 * `issuer_unavailable` is the exception: the authorization server could not be asked (503, not 401).
 */
export const OAuthFailure = z.enum([
  'malformed_token',
  'unsupported_algorithm',
  'unknown_key',
  'bad_signature',
  'token_expired',
  'token_not_yet_valid',
  'wrong_issuer',
  'wrong_audience',
  'missing_claim',
  'unmapped_subject',
  'unknown_agent',
  'revoked_agent',
  'agent_record_tampered',
  'issuer_unavailable',
]);
export type OAuthFailure = z.infer<typeof OAuthFailure>;

/** Words for people, in the problem document's `detail`. */
export const OAUTH_FAILURE_DETAIL = {
  malformed_token: 'the access token is not a well-formed signed JWT',
  unsupported_algorithm:
    'the access token must be signed with an asymmetric algorithm (RS*, PS*, ES*, EdDSA)',
  unknown_key: "the access token's signing key is not in the issuer's JWKS",
  bad_signature: "the access token's signature does not verify",
  token_expired: 'the access token has expired',
  token_not_yet_valid: 'the access token is not valid yet (nbf)',
  wrong_issuer: 'the access token was issued by another authorization server',
  wrong_audience: "the access token was issued for another resource: its aud must name this server's /mcp",
  missing_claim: 'the access token lacks the claim that names its client',
  unmapped_subject: 'the access token names a client that is not mapped to an agent here',
  unknown_agent: 'the access token maps to an agent that does not exist',
  revoked_agent: 'the access token maps to an agent that has been revoked',
  agent_record_tampered:
    'the access token maps to an agent whose record was changed in the database outside this server; an operator must check it and run: countersign agent reseal NAME',
  issuer_unavailable: 'the authorization server cannot be reached to check the token; retry shortly',
} satisfies Record<OAuthFailure, string>;

/** A verified token names an agent (by name); a refused one says why, and names the client when it could. */
export type OAuthVerdict =
  { agent_name: string; subject: string } | { failure: OAuthFailure; subject?: string };

export interface OAuthVerifier {
  /** Signature, algorithm, issuer, audience, exp/nbf, then the claim → agent map. No database. */
  verify(token: string): Promise<OAuthVerdict>;
  /** This server's resource URL (RFC 8707): what `aud` must hold. */
  resource(): string;
  readonly config: OAuthConfig;
}

/** Only asymmetric signatures: a shared secret would let anyone holding it mint tokens; `none` signs nothing. */
const ALGORITHMS = [
  ...['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512'],
  ...['ES256', 'ES384', 'ES512', 'EdDSA', 'Ed25519'],
];

/** Whether a bearer token has the shape of a JWS (three base64url parts); static tokens (`cs_…`) do not. */
export const looksLikeJwt = (token: string) => /^[\w-]+\.[\w-]+\.[\w-]*$/.test(token);

/** The JWKS could not be fetched: not the token's fault, so not an answer about it. */
class IssuerUnavailable extends Error {}

const DISCOVERY_TIMEOUT_MS = 5_000;

/**
 * The issuer's jwks_uri from its metadata: RFC 8414 (`/.well-known/oauth-authorization-server`, inserted
 * before the issuer's path), else OpenID discovery (appended). The metadata must name the same issuer
 * (RFC 8414 §3.3), or a look-alike could hand us its keys.
 */
export async function discoverJwksUri(issuer: string): Promise<URL> {
  const url = new URL(issuer);
  const path = url.pathname.replace(/\/$/, '');
  const candidates = [
    new URL(`/.well-known/oauth-authorization-server${path}`, url.origin),
    new URL(`${path}/.well-known/openid-configuration`, url.origin),
  ];
  const tried: string[] = [];
  for (const candidate of candidates) {
    const res = await fetch(candidate, {
      headers: { accept: 'application/json' },
      signal: AbortSignal.timeout(DISCOVERY_TIMEOUT_MS),
    });
    if (!res.ok) {
      tried.push(`${candidate.href} answered ${res.status}`);
      continue;
    }
    const metadata = (await res.json()) as { issuer?: unknown; jwks_uri?: unknown };
    if (metadata.issuer !== issuer) {
      throw new Error(`${candidate.href} names issuer ${JSON.stringify(metadata.issuer)}, not "${issuer}"`);
    }
    if (typeof metadata.jwks_uri !== 'string') throw new Error(`${candidate.href} names no jwks_uri`);
    return new URL(metadata.jwks_uri);
  }
  throw new Error(`no authorization server metadata for ${issuer}: ${tried.join('; ')}`);
}

/**
 * Checks agents' access tokens in process: the JWKS is fetched once (found by discovery unless
 * `jwks_uri` is configured) and refreshed by jose's remote JWKS cache (on an unknown `kid`, at most
 * every 30 s, and after 10 minutes); a failed discovery is retried on the next token.
 */
export function createOAuthVerifier(
  config: OAuthConfig,
  deps: { resource: () => string; log: Logger },
): OAuthVerifier {
  let jwks: Promise<JWTVerifyGetKey> | undefined;
  const remoteJwks = () =>
    (jwks ??= (config.jwks_uri ? Promise.resolve(new URL(config.jwks_uri)) : discoverJwksUri(config.issuer))
      .then((uri) => createRemoteJWKSet(uri))
      .catch((err: unknown) => {
        jwks = undefined;
        deps.log.warn({ err: (err as Error).message, issuer: config.issuer }, 'OAuth discovery failed');
        throw new IssuerUnavailable('discovery failed', { cause: err });
      }));
  const key: JWTVerifyGetKey = async (header, token) => {
    const getKey = await remoteJwks();
    try {
      return await getKey(header, token);
    } catch (err) {
      if (err instanceof errors.JWKSNoMatchingKey || err instanceof errors.JWKSMultipleMatchingKeys)
        throw err;
      deps.log.warn({ err: (err as Error).message, issuer: config.issuer }, 'JWKS fetch failed');
      throw new IssuerUnavailable('JWKS fetch failed', { cause: err });
    }
  };

  return {
    config,
    resource: deps.resource,
    async verify(token) {
      let header: { alg?: string };
      try {
        header = decodeProtectedHeader(token);
      } catch {
        return { failure: 'malformed_token' };
      }
      // Refused before any key is looked up: `none` and HS* never reach jose's key selection.
      if (!header.alg || !ALGORITHMS.includes(header.alg)) return { failure: 'unsupported_algorithm' };
      let payload: Record<string, unknown>;
      try {
        ({ payload } = await jwtVerify(token, key, {
          issuer: config.issuer,
          audience: deps.resource(),
          algorithms: ALGORITHMS,
          clockTolerance: config.clock_tolerance_s,
          requiredClaims: ['exp'],
        }));
      } catch (err) {
        return { failure: failureOf(err) };
      }
      const subject = payload[config.agent_claim];
      if (typeof subject !== 'string' || subject === '') return { failure: 'missing_claim' };
      const agent_name = Object.hasOwn(config.agents, subject) ? config.agents[subject] : undefined;
      return agent_name ? { agent_name, subject } : { failure: 'unmapped_subject', subject };
    },
  };
}

/** jose's refusal, as a stable reason. */
function failureOf(err: unknown): OAuthFailure {
  if (err instanceof IssuerUnavailable) return 'issuer_unavailable';
  if (err instanceof errors.JWTExpired) return 'token_expired';
  if (err instanceof errors.JWTClaimValidationFailed) {
    if (err.claim === 'iss') return 'wrong_issuer';
    if (err.claim === 'aud') return 'wrong_audience';
    if (err.claim === 'nbf') return 'token_not_yet_valid';
    return 'malformed_token';
  }
  if (err instanceof errors.JWSSignatureVerificationFailed) return 'bad_signature';
  if (err instanceof errors.JWKSNoMatchingKey || err instanceof errors.JWKSMultipleMatchingKeys) {
    return 'unknown_key';
  }
  if (err instanceof errors.JOSEAlgNotAllowed || err instanceof errors.JOSENotSupported) {
    return 'unsupported_algorithm';
  }
  if (err instanceof errors.JOSEError) return 'malformed_token';
  throw err;
}

/** The agent a verified token maps to, by name; unknown and revoked agents are refusals. */
export async function findAgentByName(
  knex: Queryable,
  name: string,
): Promise<
  { agent: Agent } | { failure: 'unknown_agent' | 'revoked_agent' | 'agent_record_tampered'; agent?: Agent }
> {
  const row = await agentRow(knex, 'name', name);
  if (!row) return { failure: 'unknown_agent' };
  if (row.tampered) return { failure: 'agent_record_tampered', agent: row.agent };
  return row.revoked ? { failure: 'revoked_agent', agent: row.agent } : { agent: row.agent };
}
