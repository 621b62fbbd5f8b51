import { createHash, createPublicKey } from 'node:crypto';
import { AppError } from '../core/errors.ts';
import type { Manifest } from './export.ts';

/**
 * The keys an offline verifier was told to trust. A manifest names its own key, and whoever rewrites an
 * export can sign it with a key of their own: only a key the verifier was given (a PEM, a fingerprint,
 * or a trust file of either) says who signed it. Without one, verification proves integrity only.
 */
export interface Pins {
  /** Public keys (SPKI PEM) given whole. */
  pems: string[];
  /** SHA-256 fingerprints of public keys (of their DER SubjectPublicKeyInfo), lowercase hex. */
  fingerprints: string[];
}

/** A public key's fingerprint: SHA-256 of its DER SubjectPublicKeyInfo, lowercase hex (its key_id starts it). */
export const fingerprintOf = (publicKeyPem: string) =>
  createHash('sha256')
    .update(createPublicKey(publicKeyPem).export({ format: 'der', type: 'spki' }))
    .digest('hex');

/** A fingerprint as typed: 64 hex digits, optionally after `sha256:`, colons and blanks ignored. */
export function parseFingerprint(text: string, where: string): string {
  const hex = text
    .trim()
    .replace(/^sha256:/i, '')
    .replace(/[:\s]/g, '')
    .toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(hex))
    throw new AppError(
      'INVALID_ARGUMENT',
      `${where}: "${text.trim()}" is not a SHA-256 key fingerprint (64 hex digits)`,
      'bad_fingerprint',
    );
  return hex;
}

/** A public key's PEM text, refused (naming where it came from) unless it is one. */
export function parsePublicKey(pem: string, where: string): string {
  try {
    createPublicKey(pem);
  } catch (e) {
    throw new AppError('INVALID_ARGUMENT', `${where} is not a public key (PEM)`, 'bad_public_key', {
      cause: e,
    });
  }
  return pem;
}

const PEM_BLOCK = /-----BEGIN PUBLIC KEY-----[\s\S]*?-----END PUBLIC KEY-----/g;

/**
 * A trust file: public keys as PEM blocks and fingerprints one a line (`sha256:HEX` or bare hex), with
 * `#` comments and blank lines. A file that names no key, or a line that is neither, is refused.
 */
export function parseTrustFile(text: string, name: string): Pins {
  const pems = [...text.matchAll(PEM_BLOCK)].map((m, i) =>
    parsePublicKey(`${m[0]}\n`, `${name}: key ${i + 1}`),
  );
  const fingerprints: string[] = [];
  for (const [i, raw] of text
    .replace(PEM_BLOCK, (block) => '\n'.repeat(block.split('\n').length - 1))
    .split('\n')
    .entries()) {
    const line = raw.replace(/#.*$/, '').trim();
    if (line) fingerprints.push(parseFingerprint(line, `${name} line ${i + 1}`));
  }
  if (pems.length + fingerprints.length === 0)
    throw new AppError('INVALID_ARGUMENT', `${name} lists no key`, 'empty_trust_file');
  return { pems, fingerprints };
}

export const pinned = (pins: Pins) => pins.pems.length + pins.fingerprints.length > 0;

/**
 * The keys to verify `manifest` with: those given whole, and the manifest's own key when a pinned
 * fingerprint names it (a fingerprint brings no key of its own). Empty when nothing pinned names a key
 * the verifier can use.
 */
export function trustedKeys(pins: Pins, manifest: Pick<Manifest, 'public_key'>): string[] {
  const keys = [...pins.pems];
  let own: string | undefined;
  try {
    own = fingerprintOf(manifest.public_key);
  } catch {
    own = undefined;
  }
  if (own && pins.fingerprints.includes(own) && !keys.some((k) => fingerprintOf(k) === own))
    keys.push(manifest.public_key);
  return keys;
}

/**
 * What verification says about who signed: with pins, whether the manifest's key is one of them;
 * without, plainly that only integrity was proven, and the fingerprint to compare.
 */
export function describeOrigin(
  pins: Pins,
  manifest: Pick<Manifest, 'public_key'>,
): { ok: boolean; text: string } {
  let fp: string;
  try {
    fp = fingerprintOf(manifest.public_key);
  } catch {
    return { ok: false, text: 'origin: the manifest carries no readable public key' };
  }
  if (!pinned(pins))
    return {
      ok: false,
      text:
        `integrity only: signed by key sha256:${fp}, taken from the export's own manifest.\n` +
        'This proves the export is intact, not who signed it: compare that fingerprint with your ' +
        "server's (countersign audit key --fingerprint), and pin it with --pubkey, --fingerprint or --trust.",
    };
  const trusted = trustedKeys(pins, manifest).some((k) => fingerprintOf(k) === fp);
  return trusted
    ? { ok: true, text: `origin: signed by pinned key sha256:${fp}` }
    : { ok: false, text: `origin: signed by key sha256:${fp}, which is not pinned` };
}
