import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK } from 'jose';
import { revokeAgent } from '../../src/accounts/agents.ts';
import { createOAuthVerifier } from '../../src/accounts/oauth.ts';
import { loadConfig, OAuthSchema } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import { createLogger } from '../../src/log.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

/** oidc-provider ships no types: the little of it this test drives. */
type OidcProviderClass = new (
  issuer: string,
  config: Record<string, unknown>,
) => { callback(): (req: IncomingMessage, res: ServerResponse) => void };
const OIDC_PROVIDER = 'oidc-provider';
const { default: Provider } = (await import(OIDC_PROVIDER)) as { default: OidcProviderClass };

const SECRET = 'a-client-secret-long-enough-for-tests';
const KID = 'as-key-1';
/** Client id → the agent countersign maps it to (stranger-app is deliberately absent). */
const AGENTS = { 'agent-app': 'oauth-agent', 'retired-app': 'retired-agent', 'ghost-app': 'no-such-agent' };
const CLIENTS = [...Object.keys(AGENTS), 'stranger-app'];

interface AuthorizationServer {
  issuer: string;
  /** The issuer's own signing key: the test signs the odd tokens a real issuer would not mint on demand. */
  key: CryptoKey;
  close(): Promise<void>;
}

/**
 * A real authorization server in this process: oidc-provider with client credentials and resource
 * indicators, issuing ES256 JWT access tokens whose `aud` is the requested resource.
 */
async function startAuthorizationServer(): Promise<AuthorizationServer> {
  const { privateKey } = await generateKeyPair('ES256', { extractable: true });
  const jwk: JWK = { ...(await exportJWK(privateKey)), kid: KID, alg: 'ES256', use: 'sig' };
  const http: Server = createServer();
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  const issuer = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  const provider = new Provider(issuer, {
    clients: CLIENTS.map((client_id) => ({
      client_id,
      client_secret: SECRET,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
    })),
    jwks: { keys: [jwk] },
    // The issuer's only key is ES256, so that is what its clients' tokens are signed with.
    clientDefaults: { id_token_signed_response_alg: 'ES256' },
    cookies: { keys: ['cookie-key-only-for-tests'] },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        useGrantedResource: () => false,
        // Any resource asked for: the wrong-audience token is a real one, issued for another resource.
        getResourceServerInfo: (_ctx: unknown, resource: string) => ({
          scope: 'mcp',
          audience: resource,
          accessTokenFormat: 'jwt',
          accessTokenTTL: 600,
          jwt: { sign: { alg: 'ES256' } },
        }),
      },
    },
  });
  http.on('request', provider.callback());
  return {
    issuer,
    key: privateKey,
    close: () => new Promise<void>((resolve) => http.close(() => resolve())),
  };
}

/** An access token from the authorization server's token endpoint (client credentials, RFC 8707 resource). */
async function issue(as: AuthorizationServer, clientId: string, resource: string): Promise<string> {
  const res = await fetch(`${as.issuer}/token`, {
    method: 'POST',
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      authorization: `Basic ${Buffer.from(`${clientId}:${SECRET}`).toString('base64')}`,
    },
    body: new URLSearchParams({ grant_type: 'client_credentials', resource, scope: 'mcp' }),
  });
  const body = (await res.json()) as { access_token?: string };
  assert.equal(res.status, 200, JSON.stringify(body));
  return body.access_token!;
}

const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');

async function post(url: string, token: string | undefined) {
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
  });
  const text = await res.text();
  return { res, json: () => JSON.parse(text) as Record<string, unknown> };
}

for (const kind of databaseKinds()) {
  describe(`OAuth access tokens for agents on ${kind}`, () => {
    let as: AuthorizationServer;
    let server: TestServer;
    let resource: string;
    let metadataUrl: string;
    before(async () => {
      as = await startAuthorizationServer();
      server = await startTestServer(kind, {
        COUNTERSIGN_OAUTH_ISSUER: as.issuer,
        COUNTERSIGN_OAUTH_AGENTS: Object.entries(AGENTS)
          .map(([client, agent]) => `${client}=${agent}`)
          .join(','),
        COUNTERSIGN_OAUTH_SCOPES: 'mcp',
      });
      await server.addAgent('oauth-agent');
      await server.addAgent('retired-agent');
      resource = `${server.url}/mcp`;
      metadataUrl = `${server.url}/.well-known/oauth-protected-resource/mcp`;
    });
    after(async () => {
      await server?.stop();
      await as?.close();
    });

    const deniedRows = async () =>
      (
        (await server.sql('audit_events').where('kind', 'auth.denied').orderBy('seq')) as {
          details: Record<string, unknown> | string;
          agent_id: string | null;
        }[]
      ).map((r) => ({
        agent_id: r.agent_id,
        details: (typeof r.details === 'string' ? JSON.parse(r.details) : r.details) as Record<
          string,
          unknown
        >,
      }));

    /** A 401 with the challenge naming the metadata, the reason in the problem, and its auth.denied row. */
    async function assertRefused(token: string, reason: string) {
      const before = (await deniedRows()).length;
      const { res, json } = await post(server.url, token);
      assert.equal(res.status, 401);
      assert.equal(
        res.headers.get('www-authenticate'),
        `Bearer resource_metadata="${metadataUrl}", error="invalid_token"`,
      );
      assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/);
      assert.deepEqual([json().code, json().reason], ['NOT_LOGGED_IN', reason]);
      const rows = (await deniedRows()).slice(before);
      assert.equal(rows.length, 1);
      assert.deepEqual([rows[0]!.details.reason, rows[0]!.details.via], [reason, 'oauth']);
      return rows[0]!;
    }

    /** Claims as the issuer would put them, for tokens the test signs itself. */
    const claims = (extra: Record<string, unknown> = {}) => ({
      client_id: 'agent-app',
      sub: 'agent-app',
      scope: 'mcp',
      ...extra,
    });
    const now = () => Math.floor(Date.now() / 1000);
    const signed = (key: CryptoKey | Uint8Array, alg: string, payload: Record<string, unknown>) =>
      new SignJWT(payload).setProtectedHeader({ alg, kid: KID, typ: 'at+jwt' }).sign(key);

    it('serves the protected-resource metadata (RFC 9728) at both well-known paths', async () => {
      for (const path of [
        '/.well-known/oauth-protected-resource',
        '/.well-known/oauth-protected-resource/mcp',
      ]) {
        const res = await fetch(new URL(path, server.url));
        assert.equal(res.status, 200);
        assert.deepEqual(await res.json(), {
          resource,
          authorization_servers: [as.issuer],
          bearer_methods_supported: ['header'],
          scopes_supported: ['mcp'],
          resource_name: 'countersign',
        });
      }
    });

    it('accepts a token the authorization server issued for this resource, and audits the call as its agent', async () => {
      const token = await issue(as, 'agent-app', resource);
      const client = await connectHttp(server.url, token);
      const result = await call(client, 'isphere_search_contacts', { query: 'alice' });
      assert.equal(result.ok, true);
      await client.close();
      const agent = await server.sql('agents').where({ name: 'oauth-agent' }).first();
      const row = await server
        .sql('audit_events')
        .where({ kind: 'tool.call', seq: result.audit.audit_seq })
        .first();
      assert.equal(row.agent_id, agent.id);
      assert.ok(!JSON.stringify(await server.sql('audit_events')).includes(token));
    });

    it('answers a request without a token with the challenge naming the metadata, without an error code', async () => {
      const { res, json } = await post(server.url, undefined);
      assert.equal(res.status, 401);
      assert.equal(res.headers.get('www-authenticate'), `Bearer resource_metadata="${metadataUrl}"`);
      assert.equal(json().reason, 'missing_token');
    });

    it('still accepts static agent tokens beside OAuth', async () => {
      const { res } = await post(server.url, server.demoToken);
      assert.equal(res.status, 200);
      await assertStaticRefused();
    });

    async function assertStaticRefused() {
      const { res, json } = await post(server.url, 'cs_not-a-real-token');
      assert.equal(res.status, 401);
      assert.match(res.headers.get('www-authenticate') ?? '', /resource_metadata=.*error="invalid_token"/);
      assert.equal(json().reason, 'unknown_token');
    }

    it('costs no more database statements per request than a static token', async () => {
      const statements = async () =>
        (await server.services.metrics.registry.getSingleMetric('countersign_db_statements_total')!.get())
          .values[0]!.value;
      /** Statements of one authenticated tools/list, after a first one warmed any cache; the least of 3 tries. */
      const cost = async (token: string) => {
        assert.equal((await post(server.url, token)).res.status, 200);
        const tries: number[] = [];
        for (let i = 0; i < 3; i++) {
          const at = await statements();
          assert.equal((await post(server.url, token)).res.status, 200);
          tries.push((await statements()) - at);
        }
        return Math.min(...tries);
      };
      const jwt = await issue(as, 'agent-app', resource);
      assert.equal(await cost(jwt), await cost(server.demoToken));
    });

    it('refuses a token issued for another resource (wrong audience)', async () => {
      await assertRefused(await issue(as, 'agent-app', 'https://elsewhere.example/mcp'), 'wrong_audience');
    });

    it('refuses an expired token, and one not valid yet', async () => {
      const expired = await signed(as.key, 'ES256', {
        ...claims({ iss: as.issuer, aud: resource, iat: now() - 3600, exp: now() - 600 }),
      });
      await assertRefused(expired, 'token_expired');
      const early = await signed(as.key, 'ES256', {
        ...claims({ iss: as.issuer, aud: resource, nbf: now() + 600, exp: now() + 1200 }),
      });
      await assertRefused(early, 'token_not_yet_valid');
    });

    it('refuses a token naming another issuer, though signed with the right key', async () => {
      const token = await signed(as.key, 'ES256', {
        ...claims({ iss: 'https://other-issuer.example', aud: resource, exp: now() + 600 }),
      });
      await assertRefused(token, 'wrong_issuer');
    });

    it('refuses a token signed by another key, under the issuer key id (bad signature) or another (unknown key)', async () => {
      const { privateKey } = await generateKeyPair('ES256');
      const token = await signed(
        privateKey,
        'ES256',
        claims({ iss: as.issuer, aud: resource, exp: now() + 600 }),
      );
      await assertRefused(token, 'bad_signature');
      const otherKid = await new SignJWT(claims({ iss: as.issuer, aud: resource, exp: now() + 600 }))
        .setProtectedHeader({ alg: 'ES256', kid: 'not-the-issuers' })
        .sign(privateKey);
      await assertRefused(otherKid, 'unknown_key');
    });

    it('refuses alg "none" and a symmetric HS256 token before looking up any key', async () => {
      const payload = claims({ iss: as.issuer, aud: resource, exp: now() + 600 });
      await assertRefused(`${b64({ alg: 'none', typ: 'at+jwt' })}.${b64(payload)}.`, 'unsupported_algorithm');
      const hs = await signed(new TextEncoder().encode(SECRET), 'HS256', payload);
      await assertRefused(hs, 'unsupported_algorithm');
    });

    it('refuses a client the map does not name, and names the client in the audit row', async () => {
      const row = await assertRefused(await issue(as, 'stranger-app', resource), 'unmapped_subject');
      assert.equal(row.details.subject, 'stranger-app');
      assert.equal(row.agent_id, null);
    });

    it('refuses a client mapped to an agent that does not exist', async () => {
      await assertRefused(await issue(as, 'ghost-app', resource), 'unknown_agent');
    });

    it('refuses a revoked agent, also to a client that was connected', async () => {
      const token = await issue(as, 'retired-app', resource);
      const client = await connectHttp(server.url, token);
      assert.equal((await call(client, 'isphere_search_groups', { query: 'board' })).ok, true);
      await revokeAgent(server.sql, 'retired-agent');
      // On PostgreSQL the cached agent is dropped when the revocation's notification arrives.
      await waitFor('the revocation to be seen', async () =>
        (await post(server.url, token)).res.status === 401 ? true : undefined,
      );
      const row = await assertRefused(token, 'revoked_agent');
      const agent = await server.sql('agents').where({ name: 'retired-agent' }).first();
      assert.equal(row.agent_id, agent.id);
      await client.close().catch(() => undefined);
    });
  });
}

describe('OAuth configuration and outages', () => {
  const log = createLogger('silent');

  it('refuses at start an oauth section that cannot work, naming the key', () => {
    const bad: [Record<string, string>, string][] = [
      [{ COUNTERSIGN_OAUTH_ISSUER: 'https://as.example' }, 'oauth.agents'],
      [{ COUNTERSIGN_OAUTH_ISSUER: 'http://as.example', COUNTERSIGN_OAUTH_AGENTS: 'a=b' }, 'oauth.issuer'],
      [
        { COUNTERSIGN_OAUTH_ISSUER: 'https://as.example', COUNTERSIGN_OAUTH_AGENTS: 'a=bad name' },
        'oauth.agents',
      ],
      [{ COUNTERSIGN_OAUTH_AGENTS: 'a=b' }, 'oauth.issuer'],
    ];
    for (const [env, key] of bad) {
      assert.throws(
        () => loadConfig(env, '/nonexistent'),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID') && err.message.includes(`"${key}`),
      );
    }
    assert.throws(
      () => loadConfig({ COUNTERSIGN_OAUTH_AGENTS: 'no-equals-sign' }, '/nonexistent'),
      (err: unknown) => isAppError(err, 'CONFIG_INVALID') && err.message.includes('COUNTERSIGN_OAUTH_AGENTS'),
    );
    const config = loadConfig(
      { COUNTERSIGN_OAUTH_ISSUER: 'https://as.example', COUNTERSIGN_OAUTH_AGENTS: 'svc@clients=agent-1' },
      '/nonexistent',
    );
    assert.deepEqual(config.oauth?.agents, { 'svc@clients': 'agent-1' });
    assert.equal(config.oauth?.agent_claim, 'client_id');
  });

  it('answers issuer_unavailable, not a verdict on the token, when the JWKS cannot be fetched', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const config = OAuthSchema.parse({
      issuer: `http://127.0.0.1:${port}`,
      jwks_uri: `http://127.0.0.1:${port}/jwks`,
      agents: { 'agent-app': 'oauth-agent' },
    });
    const verifier = createOAuthVerifier(config, { resource: () => 'http://127.0.0.1:1/mcp', log });
    const { privateKey } = await generateKeyPair('ES256');
    const token = await new SignJWT({ client_id: 'agent-app' })
      .setProtectedHeader({ alg: 'ES256', kid: KID })
      .sign(privateKey);
    assert.deepEqual(await verifier.verify(token), { failure: 'issuer_unavailable' });
  });
});
