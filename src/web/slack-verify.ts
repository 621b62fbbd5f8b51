import { createHmac, timingSafeEqual } from 'node:crypto';

/** How far a callback's timestamp may be from this server's clock (Slack's own advice: five minutes). */
export const MAX_SKEW_S = 5 * 60;

export type SignatureCheck = 'ok' | 'bad_signature' | 'stale_timestamp';

/**
 * Whether a callback was signed with the app's signing secret: `X-Slack-Signature` must be
 * `v0=` + hex HMAC-SHA256(secret, `v0:<X-Slack-Request-Timestamp>:<raw body>`), compared in constant
 * time, and the timestamp within MAX_SKEW_S of now. A stale timestamp is told apart only once the
 * signature holds: an unsigned request learns nothing but "bad signature".
 */
export function checkSignature(
  secret: string,
  headers: { timestamp: string | undefined; signature: string | undefined },
  raw: Buffer,
  nowMs: number,
): SignatureCheck {
  const { timestamp, signature } = headers;
  if (!timestamp || !/^\d{1,12}$/.test(timestamp) || !signature) return 'bad_signature';
  const expected = Buffer.from(
    `v0=${createHmac('sha256', secret).update(`v0:${timestamp}:`).update(raw).digest('hex')}`,
  );
  const given = Buffer.from(signature);
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return 'bad_signature';
  return Math.abs(nowMs / 1000 - Number(timestamp)) > MAX_SKEW_S ? 'stale_timestamp' : 'ok';
}
