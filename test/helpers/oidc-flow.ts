import assert from 'node:assert/strict';
import { WebClient } from './browser-less.ts';
import { CLIENT_ID, CLIENT_SECRET, type OpenIdProvider } from './openid-provider.ts';
import type { TestServer } from './server.ts';

/** Sign-ins through a real OpenID provider, driven as a browser without JavaScript would. */

export const CALLBACK = '/login/oidc/callback';

/** The web UI's configuration for a provider, as an operator would set it through the environment. */
export const oidcEnv = (issuer: string, port: number) => ({
  COUNTERSIGN_PORT: String(port),
  COUNTERSIGN_OIDC_ISSUER: issuer,
  COUNTERSIGN_OIDC_CLIENT_ID: CLIENT_ID,
  COUNTERSIGN_OIDC_CLIENT_SECRET: CLIENT_SECRET,
  COUNTERSIGN_OIDC_SCOPES: 'openid,email,profile,groups',
  COUNTERSIGN_OIDC_LABEL: 'Example ID',
  COUNTERSIGN_OIDC_ROLES: 'cs-chairs=chair,cs-audit=compliance',
});

/** `alter` may change the authorization request on its way out, `forge` the answer on its way back. */
export interface FlowOptions {
  next?: string;
  alter?: (url: URL) => void;
  forge?: (url: URL) => void;
}

/**
 * A sign-in driven with fetch, as a browser without JavaScript would, up to the provider's answer (not yet
 * delivered): the start, then the provider's redirects and interaction, signed in as `account` (or denied
 * when none is given), each side with its own cookies.
 */
export async function reachCallbackAt(
  server: TestServer,
  idp: OpenIdProvider,
  account: string | undefined,
  opts: FlowOptions = {},
) {
  const web = new WebClient(server.url);
  const start = await web.get(`/login/oidc${opts.next ? `?next=${encodeURIComponent(opts.next)}` : ''}`);
  assert.equal(start.res.status, 303, start.html);
  const attemptCookie = start.setCookies.find((c) => c.startsWith('cs_oidc='))!;
  let at = new URL(start.res.headers.get('location')!);
  opts.alter?.(at);
  const browser = new WebClient(idp.issuer);
  if (account) idp.signInAs(account);
  for (let hops = 0; at.origin === idp.issuer; hops++) {
    assert.ok(hops < 10, 'the provider sends the browser back');
    const step = await browser.get(at.href);
    assert.equal(step.res.status, 303, step.html);
    at = new URL(step.res.headers.get('location')!, at);
  }
  opts.forge?.(at);
  return { web, start, attemptCookie, callback: at };
}

/** A whole sign-in: reachCallbackAt, then the answer delivered to the server. */
export async function signInAt(
  server: TestServer,
  idp: OpenIdProvider,
  account: string | undefined,
  opts: FlowOptions = {},
) {
  const reached = await reachCallbackAt(server, idp, account, opts);
  const done = await reached.web.get(reached.callback.pathname + reached.callback.search);
  return { ...reached, done };
}
