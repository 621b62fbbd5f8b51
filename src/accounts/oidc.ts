import * as client from 'openid-client';
import { z } from 'zod';
import type { OidcConfig } from '../config.ts';
import type { Logger } from '../log.ts';

/**
 * Why a single sign-on was refused; each is the `reason` of its user.login_failed row. The first group are
 * answers that do not belong to this browser's attempt or cannot be trusted, the second the person's
 * standing here, and `provider_unavailable` the provider could not be asked at all.
 */
export const OidcFailure = z.enum([
  'no_attempt',
  'state_mismatch',
  'provider_error',
  'issuer_mismatch',
  'nonce_mismatch',
  'code_rejected',
  'invalid_response',
  'no_username',
  'no_role',
  'name_taken',
  'email_unverified',
  'email_in_use',
  'disabled',
  'provider_unavailable',
  'tampered',
]);
export type OidcFailure = z.infer<typeof OidcFailure>;

/** The page a refusal shows: its status, title and words for the person. */
export const OIDC_FAILURE_PAGE = {
  no_attempt: [400, 'Sign-in expired', 'This sign-in was not started here, or took too long. Start again.'],
  state_mismatch: [
    400,
    'Sign-in refused',
    'The answer from the sign-in provider does not match this attempt.',
  ],
  provider_error: [403, 'Sign-in refused', 'The sign-in provider did not sign you in.'],
  issuer_mismatch: [403, 'Sign-in refused', 'The sign-in provider is not the one this server trusts.'],
  nonce_mismatch: [
    400,
    'Sign-in refused',
    'The identity the provider returned was not issued for this attempt.',
  ],
  code_rejected: [400, 'Sign-in refused', 'The sign-in provider did not accept this sign-in. Start again.'],
  invalid_response: [
    400,
    'Sign-in refused',
    'The identity the sign-in provider returned did not pass its checks.',
  ],
  no_username: [403, 'Sign-in refused', 'Your identity carries no usable user name for this server.'],
  no_role: [
    403,
    'No access',
    'You signed in, but your account grants no role here (chair, compliance or admin).',
  ],
  name_taken: [
    403,
    'Sign-in refused',
    'A local account already uses your user name; an administrator must resolve it.',
  ],
  email_unverified: [
    403,
    'Sign-in refused',
    'An account here has your e-mail address, but the sign-in provider does not say it is verified; an administrator must link your account.',
  ],
  email_in_use: [
    403,
    'Sign-in refused',
    'Your e-mail address belongs to more than one account here, or to one linked to another identity; an administrator must link your account.',
  ],
  disabled: [403, 'Account disabled', 'Your account here is disabled.'],
  tampered: [
    403,
    'Sign-in refused',
    'Your account here was changed outside this server; an administrator must check it before you can sign in.',
  ],
  provider_unavailable: [
    503,
    'Sign-in unavailable',
    'The sign-in provider cannot be reached. Try again shortly.',
  ],
} satisfies Record<OidcFailure, readonly [number, string, string]>;

/** A refusal, with what is worth recording beside its reason (the provider's error code, a check's words). */
export interface OidcRefusal {
  failure: OidcFailure;
  error?: string;
}

/** What one authorization request must be answered with; kept by the browser that made it, sealed. */
export const OidcAttempt = z.strictObject({ state: z.string(), nonce: z.string(), verifier: z.string() });
export type OidcAttempt = z.infer<typeof OidcAttempt>;

export type OidcClaims = Record<string, unknown> & { sub: string };

export interface OidcClient {
  readonly config: OidcConfig;
  readonly redirectUri: string;
  /** A new attempt (PKCE S256 verifier, state and nonce, each random) and where to send the browser. */
  begin(): Promise<{ url: URL; attempt: OidcAttempt } | OidcRefusal>;
  /** Checks the provider's answer against the attempt, redeems the code and returns the verified claims. */
  finish(callback: URL, attempt: OidcAttempt): Promise<{ claims: OidcClaims } | OidcRefusal>;
}

const TIMEOUT_S = 10;

/** A claim by its name, else (for names with dots, e.g. Keycloak's `realm_access.roles`) by its path. */
export function claimAt(claims: Record<string, unknown>, name: string): unknown {
  if (Object.hasOwn(claims, name)) return claims[name];
  let node: unknown = claims;
  for (const key of name.split('.')) {
    if (typeof node !== 'object' || node === null || !Object.hasOwn(node, key)) return undefined;
    node = (node as Record<string, unknown>)[key];
  }
  return node;
}

/** A value the provider sent back, fit to be shown and recorded: one short printable word. */
const word = (raw: string | null | undefined) =>
  raw && /^[\x21-\x7e]{1,64}$/.test(raw) ? raw : raw ? 'unreadable' : undefined;

/**
 * The relying party. The provider's metadata is discovered once, on the first sign-in, and must name the
 * configured issuer (else every attempt is refused as issuer_mismatch); a failed discovery is retried on
 * the next. Every check is on: state, PKCE, the `iss` response parameter (RFC 9207) when sent, and the ID
 * token's signature against the provider's JWKS, its issuer, audience, expiry, issue time and nonce.
 */
export function createOidcClient(config: OidcConfig, deps: { redirectUri: string; log: Logger }): OidcClient {
  let discovered: Promise<client.Configuration> | undefined;
  const plainHttp = new URL(config.issuer).protocol === 'http:'; // loopback only: the config refuses others
  const discover = () =>
    (discovered ??= client
      .discovery(
        new URL(config.issuer),
        config.client_id,
        config.client_secret,
        config.token_endpoint_auth_method === 'client_secret_post'
          ? client.ClientSecretPost(config.client_secret)
          : client.ClientSecretBasic(config.client_secret),
        {
          timeout: TIMEOUT_S,
          execute: [client.enableNonRepudiationChecks, ...(plainHttp ? [client.allowInsecureRequests] : [])],
        },
      )
      .catch((err: unknown) => {
        discovered = undefined;
        deps.log.warn({ err: (err as Error).message, issuer: config.issuer }, 'OpenID discovery failed');
        throw err;
      }));

  // Claims the mapping needs: when the ID token lacks them, they are asked of the UserInfo endpoint.
  const lacking = (claims: Record<string, unknown>) =>
    claimAt(claims, config.role_claim) === undefined ||
    config.username_claims.every((c) => claimAt(claims, c) === undefined);

  return {
    config,
    redirectUri: deps.redirectUri,
    async begin() {
      let provider: client.Configuration;
      try {
        provider = await discover();
      } catch (err) {
        return refusalOf(err);
      }
      const attempt = {
        state: client.randomState(),
        nonce: client.randomNonce(),
        verifier: client.randomPKCECodeVerifier(),
      };
      const url = client.buildAuthorizationUrl(provider, {
        redirect_uri: deps.redirectUri,
        scope: config.scopes.join(' '),
        state: attempt.state,
        nonce: attempt.nonce,
        code_challenge: await client.calculatePKCECodeChallenge(attempt.verifier),
        code_challenge_method: 'S256',
      });
      return { url, attempt };
    },
    async finish(callback, attempt) {
      const params = callback.searchParams;
      // In openid-client's own order (state, then an error), checked here first to name the reason.
      if (params.get('state') !== attempt.state) return { failure: 'state_mismatch' };
      let provider: client.Configuration;
      try {
        provider = await discover();
      } catch (err) {
        return refusalOf(err);
      }
      const iss = params.get('iss');
      if (iss !== null && iss !== provider.serverMetadata().issuer) return { failure: 'issuer_mismatch' };
      if (params.has('error')) return { failure: 'provider_error', error: word(params.get('error')) };
      try {
        const tokens = await client.authorizationCodeGrant(provider, callback, {
          pkceCodeVerifier: attempt.verifier,
          expectedState: attempt.state,
          expectedNonce: attempt.nonce,
          idTokenExpected: true,
        });
        const idToken = tokens.claims()!;
        if (!lacking(idToken) || !provider.serverMetadata().userinfo_endpoint) return { claims: idToken };
        // UserInfo must be about the same subject (checked); the signed ID token wins where both speak.
        const info = await client.fetchUserInfo(provider, tokens.access_token, idToken.sub);
        return { claims: { ...info, ...idToken } };
      } catch (err) {
        return refusalOf(err);
      }
    },
  };
}

/** openid-client's refusal, as a stable reason; a programming error stays an error. */
function refusalOf(err: unknown): OidcRefusal {
  if (err instanceof client.ResponseBodyError) return { failure: 'code_rejected', error: word(err.error) };
  if (err instanceof client.AuthorizationResponseError) {
    return { failure: 'provider_error', error: word(err.error) };
  }
  if (err instanceof client.ClientError) {
    // Checks that fail inside oauth4webapi arrive wrapped: their facts are the cause's cause.
    const checked = err.cause instanceof Error ? err.cause : undefined;
    const cause = (checked ? checked.cause : err.cause) as
      { claim?: unknown; attribute?: unknown } | undefined;
    switch (err.code) {
      case 'OAUTH_JSON_ATTRIBUTE_COMPARISON_FAILED':
        return { failure: cause?.attribute === 'issuer' ? 'issuer_mismatch' : 'invalid_response' };
      case 'OAUTH_JWT_CLAIM_COMPARISON_FAILED':
        if (cause?.claim === 'nonce') return { failure: 'nonce_mismatch' };
        if (cause?.claim === 'iss') return { failure: 'issuer_mismatch' };
        return { failure: 'invalid_response', error: `claim ${String(cause?.claim)}` };
      case 'OAUTH_TIMEOUT':
      case 'OAUTH_ABORT':
      case 'OAUTH_RESPONSE_IS_NOT_CONFORM':
      case 'OAUTH_RESPONSE_IS_NOT_JSON':
        return { failure: 'provider_unavailable' };
      default:
        // The innermost words name the check (e.g. the signature), the library's own only its kind.
        return { failure: 'invalid_response', error: (checked ?? err).message.slice(0, 120) };
    }
  }
  // fetch() itself failed (refused, reset, DNS): a TypeError without the library's argument error code.
  if (err instanceof TypeError && !('code' in err)) return { failure: 'provider_unavailable' };
  throw err;
}
