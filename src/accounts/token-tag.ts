import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Knex } from 'knex';
import { sharedValue } from '../db/settings.ts';

/**
 * Agent tokens are `cs_`, 32 random bytes and a tag: the first 9 bytes of an HMAC-SHA256 of the
 * random part under a key every replica shares (server_secrets `agent_token_tag_key`), all base64url
 * (3 + 43 + 12 characters). The tag is a filter, not the credential: a token is an agent's only if
 * the SHA-256 of the whole of it is an agent's token_hash, as before. What the tag buys is that a
 * token nobody issued — a flood of random ones, well-formed or not — is refused from memory, with no
 * query: without the key a caller cannot make a token that passes it (one chance in 2^72 a guess).
 *
 * Tokens issued before tags are `cs_` and 43 characters. They keep working: while an active agent
 * holds one (agents.token_tagged false), a token of that shape is looked up as before; once every such
 * agent has rotated its token (or is revoked), those are refused from memory too.
 */
export type TokenShape = 'tagged' | 'untagged' | 'forged';

const KEY_NAME = 'agent_token_tag_key';
const BODY_CHARS = 43;
const TAG_BYTES = 9;
const UNTAGGED = /^cs_[A-Za-z0-9_-]{43}$/;
const TAGGED = /^cs_[A-Za-z0-9_-]{55}$/;

/** The shared key, made by whichever process asks first. */
export async function tokenTagKey(knex: Knex | Knex.Transaction): Promise<Buffer> {
  const value = await sharedValue(knex, KEY_NAME, () => randomBytes(32).toString('base64url'));
  return Buffer.from(value, 'base64url');
}

const tagOf = (key: Buffer, body: string) =>
  createHmac('sha256', key).update(body).digest().subarray(0, TAG_BYTES);

/** A new agent token, tagged. */
export function newTaggedToken(key: Buffer): string {
  const body = randomBytes(32).toString('base64url');
  return `cs_${body}${tagOf(key, body).toString('base64url')}`;
}

/** Whether `token` is tagged (and its tag right), of the shape from before tags, or neither. */
export function tokenShape(key: Buffer, token: string): TokenShape {
  if (UNTAGGED.test(token)) return 'untagged';
  if (!TAGGED.test(token)) return 'forged';
  const body = token.slice(3, 3 + BODY_CHARS);
  const tag = Buffer.from(token.slice(3 + BODY_CHARS), 'base64url');
  return timingSafeEqual(tag, tagOf(key, body)) ? 'tagged' : 'forged';
}
