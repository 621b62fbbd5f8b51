import { execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface TestTsa {
  /** Where to POST time-stamp queries (loopback). */
  url: string;
  /** The CA that issued the TSA certificate, and the TSA certificate itself (PEM files). */
  caCert: string;
  tsaCert: string;
  /** Time-stamp queries answered so far. */
  requests(): number;
  close(): Promise<void>;
}

/**
 * A real RFC 3161 time-stamping authority: `openssl ts -reply` answers every query, with a CA and a TSA
 * certificate (extendedKeyUsage critical, timeStamping) made here; the HTTP server is only its transport.
 */
export async function startTestTsa(dir: string): Promise<TestTsa> {
  fs.mkdirSync(dir, { recursive: true });
  const f = (name: string) => path.join(dir, name);
  fs.writeFileSync(
    f('tsa.ext'),
    'basicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature\nextendedKeyUsage = critical,timeStamping\n',
  );
  fs.writeFileSync(
    f('tsa.cnf'),
    [
      '[ tsa ]',
      'default_tsa = tsa_config',
      '[ tsa_config ]',
      `serial = ${f('serial')}`,
      'crypto_device = builtin',
      `signer_cert = ${f('tsa.crt')}`,
      `certs = ${f('ca.crt')}`,
      `signer_key = ${f('tsa.key')}`,
      'signer_digest = sha256',
      'default_policy = 1.3.6.1.4.1.99999.1',
      'digests = sha256',
      'accuracy = secs:1',
      'ordering = no',
      'tsa_name = yes',
      'ess_cert_id_chain = no',
      'ess_cert_id_alg = sha256',
      '',
    ].join('\n'),
  );
  fs.writeFileSync(f('serial'), '01\n');
  const subj = (cn: string) => ['-subj', `/CN=${cn}`];
  await run('openssl', [
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    f('ca.key'),
    '-out',
    f('ca.crt'),
    '-days',
    '2',
    ...subj('countersign test CA'),
  ]);
  await run('openssl', [
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    f('tsa.key'),
    '-out',
    f('tsa.csr'),
    ...subj('countersign test TSA'),
  ]);
  await run('openssl', [
    'x509',
    '-req',
    '-in',
    f('tsa.csr'),
    '-CA',
    f('ca.crt'),
    '-CAkey',
    f('ca.key'),
    '-CAcreateserial',
    '-out',
    f('tsa.crt'),
    '-days',
    '2',
    '-extfile',
    f('tsa.ext'),
  ]);

  let count = 0;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const n = ++count;
      const query = f(`q${n}.tsq`);
      const reply = f(`r${n}.tsr`);
      fs.writeFileSync(query, Buffer.concat(chunks));
      execFile(
        'openssl',
        ['ts', '-reply', '-config', f('tsa.cnf'), '-queryfile', query, '-out', reply],
        (err) => {
          if (err) {
            res.writeHead(500).end();
            return;
          }
          res.writeHead(200, { 'Content-Type': 'application/timestamp-reply' }).end(fs.readFileSync(reply));
        },
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/tsa`,
    caCert: f('ca.crt'),
    tsaCert: f('tsa.crt'),
    requests: () => count,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
