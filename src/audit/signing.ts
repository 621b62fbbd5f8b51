import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  randomBytes,
  sign,
  verify,
  type KeyObject,
} from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import canonicalize from 'canonicalize';
import { AppError } from '../core/errors.ts';

/** An Ed25519 signer; `key_id` is the SHA-256 of the raw public key, hex, first 16 characters. */
export interface Signer {
  key_id: string;
  /** SPKI PEM. */
  public_key: string;
  /** Base64 Ed25519 signature of the RFC 8785 canonical JSON of `payload`. */
  sign(payload: object): string;
}

export const keyIdOf = (publicKeyPem: string) =>
  createHash('sha256')
    .update(createPublicKey(publicKeyPem).export({ format: 'der', type: 'spki' }))
    .digest('hex')
    .slice(0, 16);

function signerFrom(privateKey: KeyObject): Signer {
  const public_key = createPublicKey(privateKey).export({ format: 'pem', type: 'spki' }).toString();
  return {
    key_id: keyIdOf(public_key),
    public_key,
    sign: (payload) => sign(null, Buffer.from(canonicalize(payload)!), privateKey).toString('base64'),
  };
}

/**
 * Writes a new key to `file` unless one is there. Written aside and linked into place, which fails if
 * the name exists: replicas starting at once on one data directory all end up reading the one key that
 * won, and never a half-written file.
 */
function createKeyFile(file: string): void {
  const { privateKey } = generateKeyPairSync('ed25519');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const aside = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  fs.writeFileSync(aside, privateKey.export({ format: 'pem', type: 'pkcs8' }), { mode: 0o600, flag: 'wx' });
  try {
    fs.linkSync(aside, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  } finally {
    fs.rmSync(aside, { force: true });
  }
}

/**
 * The signing key: from `keyPath` when configured, else `<data dir>/audit-signing-key.pem`, generated
 * (mode 0600) on first use. Several instances on one database should be given the same key by config.
 */
export function loadSigner(dataDir: string, keyPath?: string): Signer {
  const file = keyPath ?? path.join(dataDir, 'audit-signing-key.pem');
  if (!fs.existsSync(file)) {
    if (keyPath) throw new Error(`audit signing key ${keyPath} does not exist`);
    createKeyFile(file);
  }
  let key: KeyObject;
  try {
    key = createPrivateKey(fs.readFileSync(file));
  } catch (err) {
    // An empty or foreign file (a secret never filled in) stops start-up naming the key, not OpenSSL's words.
    const why = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    throw new AppError(
      'CONFIG_INVALID',
      `audit.signing_key_path (env COUNTERSIGN_AUDIT_SIGNING_KEY): ${file} holds no PEM private key (${why})`,
      'config',
    );
  }
  if (key.asymmetricKeyType !== 'ed25519') throw new Error(`${file} is not an Ed25519 private key`);
  return signerFrom(key);
}

export function verifySignature(publicKeyPem: string, payload: object, signature: string): boolean {
  try {
    return verify(
      null,
      Buffer.from(canonicalize(payload)!),
      createPublicKey(publicKeyPem),
      Buffer.from(signature, 'base64'),
    );
  } catch {
    return false;
  }
}
