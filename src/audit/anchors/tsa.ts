import { createHash, randomBytes, webcrypto } from 'node:crypto';
import * as asn1js from 'asn1js';
import * as pkijs from 'pkijs';
import { AppError } from '../../core/errors.ts';
import { fetchUnwarned } from '../../core/fetch.ts';

/**
 * RFC 3161 time-stamps of checkpoints. What is stamped is the SHA-256 of the checkpoint's signed statement
 * (the RFC 8785 canonical JSON of `{origin, seq, head_hash, ts}`, the bytes its Ed25519 signature covers),
 * so a token binds the authority's time to that one head of that one log.
 */

const SHA256_OID = '2.16.840.1.101.3.4.2.1';
/** A reply larger than this is not a time-stamp reply. */
const MAX_REPLY_BYTES = 256 * 1024;

/** pkijs's engine on Node's WebCrypto, passed to each call (pkijs keeps a global one otherwise). */
// The DOM `Crypto` type pkijs names is not in this project's libs; Node's webcrypto is that object.
const engine = () => new pkijs.CryptoEngine({ name: 'node', crypto: webcrypto as never });

const sha256 = (data: Uint8Array) => createHash('sha256').update(data).digest();
const bytesEqual = (a: ArrayBuffer | Uint8Array, b: Uint8Array) => Buffer.from(new Uint8Array(a)).equals(b);
const arrayBuffer = (b: Uint8Array): ArrayBuffer => new Uint8Array(b).buffer;

/** The certificates in a PEM text (a TSA's certificate, or the CA that issued it). */
export function parseCertificates(pem: string): pkijs.Certificate[] {
  const blocks = [...pem.matchAll(/-----BEGIN CERTIFICATE-----([\s\S]*?)-----END CERTIFICATE-----/g)];
  if (blocks.length === 0)
    throw new AppError('INVALID_ARGUMENT', 'no certificate in the PEM text', 'no_certificate');
  return blocks.map((m) => pkijs.Certificate.fromBER(Buffer.from(m[1]!.replace(/\s+/g, ''), 'base64')));
}

/** A TimeStampReq (DER) for `digest` (SHA-256), with a nonce, asking for the TSA's certificate. */
export function timeStampQuery(digest: Uint8Array, nonce: Uint8Array): Buffer {
  const req = new pkijs.TimeStampReq({
    version: 1,
    messageImprint: new pkijs.MessageImprint({
      hashAlgorithm: new pkijs.AlgorithmIdentifier({ algorithmId: SHA256_OID }),
      hashedMessage: new asn1js.OctetString({ valueHex: digest }),
    }),
    nonce: new asn1js.Integer({ valueHex: nonce }),
    certReq: true,
  });
  return Buffer.from(req.toSchema().toBER());
}

/** A positive nonce whose DER form is exactly these bytes (first byte 0x01–0x7f). */
function newNonce(): Buffer {
  const nonce = randomBytes(16);
  nonce[0] = (nonce[0]! % 0x7f) + 1;
  return nonce;
}

export type TokenProblem =
  | 'malformed'
  | 'imprint_mismatch'
  | 'nonce_mismatch'
  | 'bad_signature'
  | 'untrusted'
  | 'no_timestamping_eku'
  | 'eku_not_critical'
  | 'certificate_not_valid_at_gentime'
  | 'gentime_out_of_bound';

/** id-kp-timeStamping (RFC 3161 §2.3) and the extended key usage extension (RFC 5280 §4.2.1.12). */
const TIME_STAMPING = '1.3.6.1.5.5.7.3.8';
const EXT_KEY_USAGE = '2.5.29.37';

/**
 * How far a token's genTime may lie from the time its checkpoint was signed, when nothing else is
 * configured (audit.anchors.tsa_max_skew_s): a checkpoint is stamped as it is signed, so a token much
 * older or newer stamps that head at another time than the one it claims.
 */
export const DEFAULT_TSA_MAX_SKEW_S = 3600;

export type TokenCheck =
  { ok: true; genTime: Date } | { ok: false; problem: TokenProblem; detail: string; genTime?: Date };

function tokenParts(token: Uint8Array): { signed: pkijs.SignedData; tst: pkijs.TSTInfo } {
  const info = pkijs.ContentInfo.fromBER(arrayBuffer(token));
  if (info.contentType !== pkijs.ContentInfo.SIGNED_DATA) throw new Error('not a CMS SignedData');
  const signed = new pkijs.SignedData({ schema: info.content });
  const content = signed.encapContentInfo.eContent;
  if (!content) throw new Error('no TSTInfo in the token');
  return { signed, tst: pkijs.TSTInfo.fromBER(content.getValue()) };
}

const validAt = (cert: pkijs.Certificate, at: Date) =>
  cert.notBefore.value.getTime() <= at.getTime() && at.getTime() <= cert.notAfter.value.getTime();

/**
 * Whether `cert` is one of `trusted` (a pinned TSA certificate), or was signed by one of them (a CA)
 * that was itself valid at `at`.
 */
async function trustedSigner(
  cert: pkijs.Certificate,
  trusted: pkijs.Certificate[],
  at: Date,
): Promise<boolean> {
  const der = Buffer.from(cert.toSchema().toBER());
  for (const t of trusted) {
    if (Buffer.from(t.toSchema().toBER()).equals(der)) return true;
    if (validAt(t, at) && (await cert.verify(t, engine()).catch(() => false))) return true;
  }
  return false;
}

/**
 * What RFC 3161 §2.3 and RFC 5280 ask of the certificate that signed a token: the extended key usage
 * extension, marked critical, naming time-stamping, and a validity period that holds `genTime`.
 */
function signerCertificateProblem(
  cert: pkijs.Certificate,
  genTime: Date,
): { problem: TokenProblem; detail: string } | undefined {
  const eku = cert.extensions?.find((e) => e.extnID === EXT_KEY_USAGE);
  const purposes = (eku?.parsedValue as pkijs.ExtKeyUsage | undefined)?.keyPurposes ?? [];
  if (!eku || !purposes.includes(TIME_STAMPING))
    return {
      problem: 'no_timestamping_eku',
      detail: 'the signing certificate does not carry the time-stamping extended key usage',
    };
  if (!eku.critical)
    return {
      problem: 'eku_not_critical',
      detail: 'the signing certificate marks its extended key usage not critical (RFC 3161 §2.3)',
    };
  if (!validAt(cert, genTime))
    return {
      problem: 'certificate_not_valid_at_gentime',
      detail:
        `the signing certificate is valid ${cert.notBefore.value.toISOString()} to ` +
        `${cert.notAfter.value.toISOString()}, not at genTime ${genTime.toISOString()}`,
    };
  return undefined;
}

/** A genTime further than `maxSkewS` from when the checkpoint says it was signed. */
function skewProblem(genTime: Date, signedAt: Date, maxSkewS: number): string | undefined {
  const skew = Math.abs(genTime.getTime() - signedAt.getTime()) / 1000;
  if (!(skew <= maxSkewS))
    return (
      `genTime ${genTime.toISOString()} is ${Math.round(skew)} s from the checkpoint's time ` +
      `${signedAt.toISOString()}; at most ${maxSkewS} s are accepted`
    );
  return undefined;
}

/** What a token is checked against, beyond the statement it stamps. */
export interface TokenOptions {
  /** The pinned TSA certificate or the CA that issues them; without, who signed is not checked. */
  trusted?: pkijs.Certificate[];
  nonce?: Uint8Array;
  /** When the stamped checkpoint was signed (its `ts`): genTime must lie within `maxSkewS` of it. */
  signedAt?: Date;
  /** Default DEFAULT_TSA_MAX_SKEW_S. */
  maxSkewS?: number;
}

/**
 * Checks a time-stamp token (DER) over `statement`: the imprint is SHA-256 of it, the nonce (when given)
 * is ours, the CMS signature holds, the signing certificate carries the critical time-stamping EKU and
 * is valid at genTime, the signer is one of `trusted` or issued by one of them (valid then too), and
 * genTime lies near the checkpoint's own time. Without `trusted` the signature is checked but not who
 * made it.
 */
export async function checkToken(
  token: Uint8Array,
  statement: Uint8Array,
  opts: TokenOptions = {},
): Promise<TokenCheck> {
  let parts;
  try {
    parts = tokenParts(token);
  } catch (err) {
    return { ok: false, problem: 'malformed', detail: (err as Error).message };
  }
  const { signed, tst } = parts;
  const genTime = tst.genTime;
  const imprint = tst.messageImprint;
  if (
    imprint.hashAlgorithm.algorithmId !== SHA256_OID ||
    !bytesEqual(imprint.hashedMessage.valueBlock.valueHexView, sha256(statement))
  )
    return { ok: false, problem: 'imprint_mismatch', detail: 'the token stamps other data', genTime };
  if (opts.nonce && !(tst.nonce && bytesEqual(tst.nonce.valueBlock.valueHexView, opts.nonce)))
    return { ok: false, problem: 'nonce_mismatch', detail: 'the reply does not carry our nonce', genTime };
  let result;
  try {
    result = await signed.verify({ signer: 0, data: arrayBuffer(statement), extendedMode: true }, engine());
  } catch (err) {
    return { ok: false, problem: 'bad_signature', detail: (err as Error).message, genTime };
  }
  if (!result.signatureVerified || !result.signerCertificate)
    return { ok: false, problem: 'bad_signature', detail: 'the token signature does not verify', genTime };
  const certProblem = signerCertificateProblem(result.signerCertificate, genTime);
  if (certProblem) return { ok: false, ...certProblem, genTime };
  if (opts.trusted && !(await trustedSigner(result.signerCertificate, opts.trusted, genTime)))
    return {
      ok: false,
      problem: 'untrusted',
      detail: 'signed by a certificate not given as trusted',
      genTime,
    };
  const skew = opts.signedAt && skewProblem(genTime, opts.signedAt, opts.maxSkewS ?? DEFAULT_TSA_MAX_SKEW_S);
  if (skew) return { ok: false, problem: 'gentime_out_of_bound', detail: skew, genTime };
  return { ok: true, genTime };
}

/**
 * Asks the authority at `url` to stamp `statement` and checks its reply (granted, our imprint, our nonce,
 * a valid signature, by `trusted` when given). Returns the token, DER in base64. Refusals are
 * SOURCE_UNAVAILABLE: the authority, not the log, is at fault.
 */
export async function requestTimeStamp(
  url: string,
  statement: Uint8Array,
  opts: Omit<TokenOptions, 'nonce'> & { timeoutMs: number },
): Promise<{ token: string; genTime: Date }> {
  const nonce = newNonce();
  const fail = (reason: string, message: string, cause?: unknown) =>
    new AppError('SOURCE_UNAVAILABLE', `time-stamping authority ${url}: ${message}`, reason, { cause });
  let reply: Buffer;
  try {
    const res = await fetchUnwarned(url, {
      method: 'POST',
      headers: { 'Content-Type': 'application/timestamp-query', Accept: 'application/timestamp-reply' },
      body: timeStampQuery(sha256(statement), nonce),
      signal: AbortSignal.timeout(opts.timeoutMs),
    });
    if (!res.ok) throw fail('tsa_http_status', `answered HTTP ${res.status}`);
    reply = Buffer.from(await res.arrayBuffer());
  } catch (err) {
    if (err instanceof AppError) throw err;
    throw fail('tsa_unreachable', (err as Error).message, err);
  }
  if (reply.length > MAX_REPLY_BYTES) throw fail('tsa_reply_invalid', 'the reply is too large');
  let resp: pkijs.TimeStampResp;
  try {
    resp = pkijs.TimeStampResp.fromBER(arrayBuffer(reply));
  } catch (err) {
    throw fail('tsa_reply_invalid', `not a time-stamp reply (${(err as Error).message})`, err);
  }
  // 0 granted, 1 granted with modifications; anything else is a refusal.
  if (resp.status.status !== 0 && resp.status.status !== 1)
    throw fail('tsa_refused', `refused the request (status ${resp.status.status})`);
  if (!resp.timeStampToken) throw fail('tsa_reply_invalid', 'granted without a token');
  const token = Buffer.from(resp.timeStampToken.toSchema().toBER());
  const check = await checkToken(token, statement, { ...opts, nonce });
  if (!check.ok) throw fail('tsa_reply_invalid', `${check.problem}: ${check.detail}`);
  return { token: token.toString('base64'), genTime: check.genTime };
}
