// The stack's first step (compose.yaml's "init" service): what every replica must share, made once into
// one directory (a volume), never replaced, then the database's migrations applied once.
//
//   audit-signing-key.pem  Ed25519 key that signs audit checkpoints (COUNTERSIGN_AUDIT_SIGNING_KEY)
//   db-password            the PostgreSQL password (POSTGRES_PASSWORD_FILE of the database container)
//   database-url           DATABASE_URL with that password (the replicas' DATABASE_URL_FILE)
//   host-roots.json        the host roots (COUNTERSIGN_HOST_ROOTS), made by the first countersign
//                          command that runs with it set: `countersign migrate` below
//
// Runs as the image's user; the files are readable by that user only, but for db-password, which the
// database container reads as its own user. Exit 0 once all is there and migrated, else 1 with the reason.
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const dir = process.env.COUNTERSIGN_SHARED_DIR || '/etc/countersign/shared';
const dbHost = process.env.POSTGRES_HOST || 'db';
const dbUser = process.env.POSTGRES_USER || 'countersign';
const dbName = process.env.POSTGRES_DB || 'countersign';
const waitS = Number(process.env.COUNTERSIGN_INIT_WAIT_S || 120);

const say = (line) => process.stderr.write(`init: ${line}\n`);

/** Writes `file` unless it exists (another init run made it): what is there is kept, never replaced. */
function makeOnce(name, content, mode) {
  const file = path.join(dir, name);
  try {
    fs.writeFileSync(file, content(), { flag: 'wx', mode });
    say(`made ${file}`);
  } catch (err) {
    if (err.code !== 'EEXIST') throw err;
    say(`kept ${file}`);
  }
  return file;
}

fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
const key = makeOnce(
  'audit-signing-key.pem',
  () => crypto.generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }),
  0o400,
);
const password = fs.readFileSync(
  makeOnce('db-password', () => crypto.randomBytes(24).toString('base64url'), 0o444),
  'utf8',
);
const url = makeOnce(
  'database-url',
  () => `postgres://${dbUser}:${password}@${dbHost}:5432/${dbName}\n`,
  0o400,
);

// Migrations once, before the replicas: the database may still be starting, so tried for a while.
const env = {
  ...process.env,
  DATABASE_URL_FILE: url,
  COUNTERSIGN_AUDIT_SIGNING_KEY: key,
  COUNTERSIGN_HOST_ROOTS: process.env.COUNTERSIGN_HOST_ROOTS || path.join(dir, 'host-roots.json'),
};
delete env.DATABASE_URL;
const deadline = Date.now() + waitS * 1000;
for (;;) {
  const run = spawnSync('node', ['/opt/countersign/dist/cli.js', 'migrate'], { env, encoding: 'utf8' });
  if (run.status === 0) break;
  if (Date.now() > deadline) {
    say(`the database was not ready within ${waitS} s: ${run.stderr.trim()}`);
    process.exit(1);
  }
  await sleep(2000);
}
if (!fs.existsSync(env.COUNTERSIGN_HOST_ROOTS)) {
  say(`countersign migrate made no host roots file at ${env.COUNTERSIGN_HOST_ROOTS}`);
  process.exit(1);
}
say(`host roots in ${env.COUNTERSIGN_HOST_ROOTS}`);
say('migrations applied; the replicas can start');
