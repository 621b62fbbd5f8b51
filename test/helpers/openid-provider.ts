import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair, type JWK } from 'jose';

/** oidc-provider ships no types: the little of it these tests drive. */
interface OidcProvider {
  callback(): (req: IncomingMessage, res: ServerResponse) => void;
  interactionFinished(
    req: IncomingMessage,
    res: ServerResponse,
    result: Record<string, unknown>,
    options?: { mergeWithLastSubmission?: boolean },
  ): Promise<void>;
  Grant: new (init: { clientId: string; accountId: string }) => {
    addOIDCScope(scope: string): void;
    save(): Promise<string>;
  };
}
type OidcProviderClass = new (issuer: string, config: Record<string, unknown>) => OidcProvider;
const OIDC_PROVIDER = 'oidc-provider';
const { default: Provider } = (await import(OIDC_PROVIDER)) as { default: OidcProviderClass };

export const CLIENT_ID = 'countersign-web';
export const CLIENT_SECRET = 'a-client-secret-only-for-tests';

/** The claims a person's account carries besides `sub` (which is the account id). */
export type AccountClaims = Record<string, unknown>;

export interface OpenIdProvider {
  issuer: string;
  /** Account id (the subject) → claims; tests change them between sign-ins. */
  accounts: Map<string, AccountClaims>;
  /** When set, the provider's JWKS answers another key under its signing key's id (its ID tokens then fail). */
  decoyKeys: boolean;
  /**
   * Who the next sign-in at the provider signs in as (queued, one per sign-in): the interaction logs them
   * in without a form; with none queued it answers access_denied.
   */
  signInAs(accountId: string): void;
  close(): Promise<void>;
}

/** A port free right now, for a server whose own address must be known before it starts. */
export async function freePort(): Promise<number> {
  const probe = createNetServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}

/**
 * A real OpenID provider in this process: oidc-provider with one confidential client (authorization code,
 * PKCE required, ES256 ID tokens), the scopes email, profile and groups, and an interaction that signs in
 * the account the test chose, with consent already granted. `host` names it in its issuer (`localhost`
 * makes it another site than a server on 127.0.0.1, as a real provider is).
 */
export async function startOpenIdProvider(opts: {
  redirectUris: string[];
  host?: string;
}): Promise<OpenIdProvider> {
  const { privateKey } = await generateKeyPair('ES256', { extractable: true });
  const jwk: JWK = { ...(await exportJWK(privateKey)), kid: 'idp-key-1', alg: 'ES256', use: 'sig' };
  const other = (await generateKeyPair('ES256', { extractable: true })).publicKey;
  const decoy: JWK = { ...(await exportJWK(other)), kid: jwk.kid, alg: 'ES256', use: 'sig' };
  const accounts = new Map<string, AccountClaims>();
  const queued: string[] = [];
  const http: Server = createServer();
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  const issuer = `http://${opts.host ?? '127.0.0.1'}:${(http.address() as AddressInfo).port}`;

  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: CLIENT_ID,
        client_secret: CLIENT_SECRET,
        redirect_uris: opts.redirectUris,
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
        id_token_signed_response_alg: 'ES256',
      },
    ],
    jwks: { keys: [jwk] },
    cookies: { keys: ['provider-cookie-key-only-for-tests'] },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['preferred_username', 'name'],
      groups: ['groups'],
    },
    scopes: ['openid', 'email', 'profile', 'groups'],
    pkce: { required: () => true, methods: ['S256'] },
    features: { devInteractions: { enabled: false } },
    findAccount: (_ctx: unknown, id: string) => {
      const claims = accounts.get(id);
      return claims && { accountId: id, claims: () => ({ sub: id, ...claims }) };
    },
    // Consent is part of the test's set-up, not what it tests: every scope asked for is granted.
    loadExistingGrant: async (ctx: {
      oidc: { client: { clientId: string }; session: { accountId: string }; params: { scope: string } };
    }) => {
      const grant = new provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope(ctx.oidc.params.scope);
      await grant.save();
      return grant;
    },
  });
  const handle = provider.callback();
  http.on('request', (req, res) => {
    if (served.decoyKeys && req.url === '/jwks') {
      res.writeHead(200, { 'content-type': 'application/jwk-set+json' });
      return res.end(JSON.stringify({ keys: [decoy] }));
    }
    if (!req.url?.startsWith('/interaction/')) return handle(req, res);
    const accountId = queued.shift();
    const result = accountId
      ? { login: { accountId } }
      : { error: 'access_denied', error_description: 'no account chosen' };
    provider
      .interactionFinished(req, res, result, { mergeWithLastSubmission: false })
      .catch((err: unknown) => {
        res.statusCode = 500;
        res.end(String(err));
      });
  });

  const served: OpenIdProvider = {
    issuer,
    accounts,
    decoyKeys: false,
    signInAs: (accountId) => void queued.push(accountId),
    close: () =>
      new Promise<void>((resolve) => {
        http.closeAllConnections();
        http.close(() => resolve());
      }),
  };
  return served;
}
