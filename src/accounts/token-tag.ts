import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { HostRoots } from '../core/host-roots.ts';

/**
 * Agent tokens are `cs_`, 32 random bytes and a tag: the first 9 bytes of an HMAC-SHA256 of the
 * random part under the host roots' token tag key (docs/identity.md, "Agent tokens"), all base64url
 * (3 + 43 + 12 characters). The tag is a filter, not the credential: a token is an agent's only if its
 * MAC under the host's agent-token key is an agent's token_hash (agents.ts). What the tag buys is that
 * a token nobody issued — a flood of random ones, well-formed or not — is refused from memory, with no
 * query: without the key, which is on the host and not in the database, a caller cannot make a token
 * that passes it (one chance in 2^72 a guess). Tokens tagged under the key the database held before
 * (taken over onto the host at the upgrade) keep passing.
 *
 * Tokens issued before tags are `cs_` and 43 characters. They keep working: while an active agent
 * holds one (agents.token_tagged false), a token of that shape is looked up as before; once every such
 * agent has rotated its token (or is revoked), those are refused from memory too.
 */
export type TokenShape = 'tagged' | 'untagged' | 'forged';

const BODY_CHARS = 43;
const TAG_BYTES = 9;
const UNTAGGED = /^cs_[A-Za-z0-9_-]{43}$/;
const TAGGED = /^cs_[A-Za-z0-9_-]{55}$/;

/** The key new tokens are tagged under, derived from the host roots. */
export const tokenTagKey = (roots: HostRoots): Buffer => roots.key('token-tag');

/** Every key a token's tag may be made under: the host's, and those taken over from the database. */
export const tokenTagKeys = (roots: HostRoots): Buffer[] => [tokenTagKey(roots), ...roots.legacyTokenTagKeys];

const tagOf = (key: Buffer, body: string) =>
  createHmac('sha256', key).update(body).digest().subarray(0, TAG_BYTES);

/** A new agent token, tagged. */
export function newTaggedToken(key: Buffer): string {
  const body = randomBytes(32).toString('base64url');
  return `cs_${body}${tagOf(key, body).toString('base64url')}`;
}

/** Whether `token` is tagged (and its tag right), of the shape from before tags, or neither. */
export function tokenShape(keys: Buffer | readonly Buffer[], token: string): TokenShape {
  if (UNTAGGED.test(token)) return 'untagged';
  if (!TAGGED.test(token)) return 'forged';
  const body = token.slice(3, 3 + BODY_CHARS);
  const tag = Buffer.from(token.slice(3 + BODY_CHARS), 'base64url');
  const all = Buffer.isBuffer(keys) ? [keys] : keys;
  return all.some((key) => timingSafeEqual(tag, tagOf(key, body))) ? 'tagged' : 'forged';
}
