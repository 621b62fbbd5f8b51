import { createHash, createPrivateKey, webcrypto } from 'node:crypto';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import * as asn1js from 'asn1js';
import * as pkijs from 'pkijs';
import type { TestTsa } from './tsa.ts';

const run = promisify(execFile);
const engine = () => new pkijs.CryptoEngine({ name: 'node', crypto: webcrypto as never });
const buffer = (b: Uint8Array): ArrayBuffer => new Uint8Array(b).buffer;
/** The DER of the first PEM block of `pem` (openssl ca writes the certificate's text before it). */
const der = (pem: string) =>
  Buffer.from(/-----BEGIN [^-]+-----([\s\S]*?)-----END/.exec(pem)![1]!.replace(/\s+/g, ''), 'base64');

/** A signing certificate and its key (PEM files) issued by the test TSA's CA. */
export interface TsaSigner {
  cert: string;
  key: string;
}

/**
 * A certificate the test TSA's CA issues with the extensions `ext` (an openssl extfile's lines), valid
 * for `days` from now: how a CA would issue one without the time-stamping EKU, or with it not critical.
 */
export async function issueTsaCertificate(
  tsa: TestTsa,
  name: string,
  ext: string,
  days = 2,
): Promise<TsaSigner> {
  const dir = path.dirname(tsa.caCert);
  const f = (suffix: string) => path.join(dir, `${name}.${suffix}`);
  fs.writeFileSync(f('ext'), `basicConstraints = CA:FALSE\n${ext}\n`);
  await run('openssl', [
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    f('key'),
    '-out',
    f('csr'),
    '-subj',
    `/CN=${name}`,
  ]);
  await run('openssl', [
    'x509',
    '-req',
    '-in',
    f('csr'),
    '-CA',
    tsa.caCert,
    '-CAkey',
    path.join(dir, 'ca.key'),
    '-CAcreateserial',
    '-out',
    f('crt'),
    '-days',
    String(days),
    '-extfile',
    f('ext'),
  ]);
  return { cert: f('crt'), key: f('key') };
}

/**
 * An RFC 3161 token over `statement` (imprint SHA-256) dated `genTime`, signed by `signer` as a TSA
 * signs one (CMS SignedData of a TSTInfo, content-type and message-digest attributes, the certificate
 * attached): a time-stamp any date can be put on, for what `openssl ts -reply` will not make.
 */
export async function stampToken(signer: TsaSigner, statement: Uint8Array, genTime: Date): Promise<Buffer> {
  const cert = pkijs.Certificate.fromBER(der(fs.readFileSync(signer.cert, 'utf8')));
  const tst = new pkijs.TSTInfo({
    version: 1,
    policy: '1.3.6.1.4.1.99999.1',
    messageImprint: new pkijs.MessageImprint({
      hashAlgorithm: new pkijs.AlgorithmIdentifier({ algorithmId: '2.16.840.1.101.3.4.2.1' }),
      hashedMessage: new asn1js.OctetString({ valueHex: createHash('sha256').update(statement).digest() }),
    }),
    serialNumber: new asn1js.Integer({ value: Math.floor(Math.random() * 1e9) }),
    genTime,
  });
  const content = Buffer.from(tst.toSchema().toBER());
  const signed = new pkijs.SignedData({
    version: 3,
    encapContentInfo: new pkijs.EncapsulatedContentInfo({
      eContentType: '1.2.840.113549.1.9.16.1.4',
      eContent: new asn1js.OctetString({ valueHex: content }),
    }),
    signerInfos: [
      new pkijs.SignerInfo({
        version: 1,
        sid: new pkijs.IssuerAndSerialNumber({ issuer: cert.issuer, serialNumber: cert.serialNumber }),
        signedAttrs: new pkijs.SignedAndUnsignedAttributes({
          type: 0,
          attributes: [
            new pkijs.Attribute({
              type: '1.2.840.113549.1.9.3',
              values: [new asn1js.ObjectIdentifier({ value: '1.2.840.113549.1.9.16.1.4' })],
            }),
            new pkijs.Attribute({
              type: '1.2.840.113549.1.9.4',
              values: [new asn1js.OctetString({ valueHex: createHash('sha256').update(content).digest() })],
            }),
          ],
        }),
      }),
    ],
    certificates: [cert],
  });
  const pkcs8 = createPrivateKey(fs.readFileSync(signer.key)).export({ format: 'der', type: 'pkcs8' });
  const key = await webcrypto.subtle.importKey(
    'pkcs8',
    buffer(pkcs8),
    { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' },
    false,
    ['sign'],
  );
  await signed.sign(key as never, 0, 'SHA-256', undefined, engine());
  const info = new pkijs.ContentInfo({
    contentType: pkijs.ContentInfo.SIGNED_DATA,
    content: signed.toSchema(true),
  });
  return Buffer.from(info.toSchema().toBER());
}

/**
 * A self-signed TSA certificate (critical time-stamping EKU) valid from 2000 to 2030, to pin as the
 * trusted TSA certificate: one under which a token dated 2001 has a valid signer, so that only the
 * distance between its genTime and its checkpoint's time can refuse it.
 */
export async function longLivedTsaCertificate(dir: string): Promise<TsaSigner> {
  const ca = path.join(dir, 'long-lived');
  fs.mkdirSync(ca, { recursive: true });
  const f = (name: string) => path.join(ca, name);
  fs.writeFileSync(f('index.txt'), '');
  fs.writeFileSync(f('serial'), '01\n');
  fs.writeFileSync(
    f('ca.cnf'),
    [
      '[ ca ]',
      'default_ca = long_lived',
      '[ long_lived ]',
      `database = ${f('index.txt')}`,
      `serial = ${f('serial')}`,
      `new_certs_dir = ${ca}`,
      'default_md = sha256',
      'policy = anything',
      'unique_subject = no',
      'x509_extensions = tsa',
      '[ anything ]',
      'commonName = supplied',
      '[ tsa ]',
      'basicConstraints = CA:FALSE',
      'keyUsage = critical,digitalSignature',
      'extendedKeyUsage = critical,timeStamping',
      '',
    ].join('\n'),
  );
  await run('openssl', [
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    f('tsa.key'),
    '-out',
    f('tsa.csr'),
    '-subj',
    '/CN=long-lived TSA',
  ]);
  await run('openssl', [
    'ca',
    '-batch',
    '-config',
    f('ca.cnf'),
    '-selfsign',
    '-keyfile',
    f('tsa.key'),
    '-in',
    f('tsa.csr'),
    '-out',
    f('tsa.crt'),
    '-startdate',
    '20000101000000Z',
    '-enddate',
    '20301231000000Z',
  ]);
  return { cert: f('tsa.crt'), key: f('tsa.key') };
}
