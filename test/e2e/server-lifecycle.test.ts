import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import canonicalize from 'canonicalize';
import { configDigest, redactedConfig } from '../../src/app/config-digest.ts';
import { loadConfig } from '../../src/config.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { call, connectStdio, testEnv, waitFor } from '../helpers/server.ts';

const WEBHOOK_SECRET = 'a-webhook-secret-nobody-may-see';
const WEBHOOK_PATH = 'T0SECRET/B0SECRET/xoxSECRETPATH';
const BRIDGE_TOKEN = 'Bearer bridge-token-secret';
const DB_PASSWORD = 'pg-password-secret';

interface Row {
  seq: number;
  kind: string;
  actor: string | null;
  result: string | null;
  details: Record<string, unknown>;
}

/** The whole log, read through an export (what compliance gets). */
async function exported(env: Record<string, string>, dir: string): Promise<{ rows: Row[]; text: string }> {
  const file = path.join(dir, `lifecycle-${Date.now()}.jsonl`);
  const res = await runCli(['audit', 'export', '-o', file], env);
  assert.equal(res.code, 0, res.stderr);
  const text = fs.readFileSync(file, 'utf8');
  return {
    rows: text
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Row),
    text,
  };
}

describe('the config digest of server.started', () => {
  const base = {
    COUNTERSIGN_DATA_DIR: '/srv/countersign',
    DATABASE_URL: `postgres://app:${DB_PASSWORD}@db.internal:5432/countersign?sslpassword=${DB_PASSWORD}`,
    COUNTERSIGN_WEBHOOK_URL: `https://hooks.example.com/services/${WEBHOOK_PATH}`,
    COUNTERSIGN_WEBHOOK_SECRET: WEBHOOK_SECRET,
    COUNTERSIGN_BRIDGE_URL: 'https://bridge.example.com/v1?key=bridge-query-secret',
    COUNTERSIGN_METRICS_TOKEN: 'metrics-token-secret-0123',
    COUNTERSIGN_SMTP_URL: 'smtps://mailer:smtp-url-secret@mail.example.com:465',
    COUNTERSIGN_EMAIL_FROM: 'countersign@example.com',
    OTEL_EXPORTER_OTLP_ENDPOINT: 'https://otel:otlp-secret@collector.example.com/?token=otlp-query-secret',
  };
  const digestOf = (env: Record<string, string>) => configDigest(loadConfig(env, '/'));

  it('is the SHA-256 of the canonical JSON of the config with every secret taken out', () => {
    const config = loadConfig(base, '/');
    const redacted = canonicalize(redactedConfig(config))!;
    const more = ['metrics-token-secret', 'smtp-url-secret', 'otlp-secret', 'otlp-query-secret'];
    for (const secret of [DB_PASSWORD, WEBHOOK_SECRET, 'SECRET', 'bridge-query-secret', ...more]) {
      assert.ok(!redacted.includes(secret), `${secret} left in ${redacted}`);
    }
    assert.match(redacted, /postgres:\/\/app:\[redacted\]@db\.internal:5432\/countersign/);
    assert.equal(configDigest(config), createHash('sha256').update(redacted).digest('hex'));
  });

  it('changes when a setting changes, and not when only a secret does (no secret goes into it)', () => {
    const digest = digestOf(base);
    assert.match(digest, /^[0-9a-f]{64}$/);
    assert.equal(digestOf({ ...base }), digest, 'the same config, the same digest');
    assert.notEqual(digestOf({ ...base, COUNTERSIGN_RATE_LIMIT_PER_MIN: '61' }), digest);
    assert.notEqual(digestOf({ ...base, COUNTERSIGN_PORT: '9000' }), digest);
    assert.equal(digestOf({ ...base, COUNTERSIGN_WEBHOOK_SECRET: 'another-secret-of-some-length' }), digest);
    assert.equal(
      digestOf({ ...base, DATABASE_URL: base.DATABASE_URL.replaceAll(DB_PASSWORD, 'other-password') }),
      digest,
    );
    assert.equal(
      digestOf({ ...base, COUNTERSIGN_WEBHOOK_URL: 'https://hooks.example.com/services/T1/B1/other' }),
      digest,
    );
  });

  it('keeps header and environment names of bridge and upstreams, never their values', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-digest-'));
    try {
      const file = path.join(dir, 'countersign.config.json');
      const write = (token: string) =>
        fs.writeFileSync(
          file,
          JSON.stringify({
            bridge: { url: 'https://bridge.example.com/', headers: { Authorization: token } },
            upstreams: [
              { name: 'fs', command: 'npx', args: ['server-fs'], env: { API_KEY: token } },
              { name: 'crm', url: 'https://crm.example.com/mcp', headers: { Authorization: token } },
            ],
          }),
        );
      write(BRIDGE_TOKEN);
      const config = loadConfig({ COUNTERSIGN_CONFIG: file }, dir);
      const redacted = canonicalize(redactedConfig(config))!;
      assert.ok(!redacted.includes('bridge-token-secret'), redacted);
      assert.match(redacted, /"Authorization":"\[redacted\]"/);
      assert.match(redacted, /"API_KEY":"\[redacted\]"/);
      write('Bearer a-rotated-token');
      assert.equal(configDigest(loadConfig({ COUNTERSIGN_CONFIG: file }, dir)), configDigest(config));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

for (const kind of databaseKinds()) {
  describe(`server.started and server.stopped on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    before(async () => {
      db = await createTestDatabase(kind);
      env = testEnv(db, {
        COUNTERSIGN_WEBHOOK_URL: `http://127.0.0.1:9/services/${WEBHOOK_PATH}`,
        COUNTERSIGN_WEBHOOK_SECRET: WEBHOOK_SECRET,
      });
    });
    after(async () => db?.drop());

    it('records each start and clean stop of HTTP and stdio servers; a crash leaves only its start', async () => {
      const http = await spawnServer(env);
      const token = await waitFor(
        'the first-run banner',
        async () => /demo agent token \(shown once\): (cs_\S+)/.exec(http.stderr())?.[1],
      );
      await stopChild(http.child); // SIGTERM

      // LOG_LEVEL as spawnServer sets it: the same settings as the HTTP starts.
      const { client, exited } = await connectStdio({
        ...env,
        LOG_LEVEL: 'info',
        COUNTERSIGN_AGENT_TOKEN: token,
      });
      await call(client, 'isphere_search_contacts', { query: 'David' });
      await client.close(); // stdin closes
      await exited();

      const crashed = await spawnServer(env);
      crashed.child.kill('SIGKILL'); // no chance to record a stop
      await new Promise((resolve) => crashed.child.once('exit', resolve));

      const changed = await spawnServer({ ...env, COUNTERSIGN_RATE_LIMIT_PER_MIN: '99999' });
      await stopChild(changed.child);

      // A start that ends in an error (a refused token) records why it stopped.
      const refused = await runCli(['serve', '--stdio'], { ...env, COUNTERSIGN_AGENT_TOKEN: 'cs_wrong' });
      assert.equal(refused.code, 1);

      // A crash is harmless: the chain is whole.
      const verified = await runCli(['audit', 'verify', '--db'], env);
      assert.equal(verified.code, 0, verified.stdout + verified.stderr);
      assert.match(verified.stdout, /^(\d+)\/\1 rows valid/);

      const { rows, text } = await exported(env, db.dataDir);
      const started = rows.filter((r) => r.kind === 'server.started');
      const stopped = rows.filter((r) => r.kind === 'server.stopped');
      assert.deepEqual(
        started.map((r) => r.details.transport),
        ['http', 'stdio', 'http', 'http', 'stdio'],
      );
      assert.deepEqual(
        stopped.map((r) => [r.details.transport, r.details.reason, r.details.pid]),
        [
          ['http', 'signal', started[0]!.details.pid],
          ['stdio', 'stdin_closed', started[1]!.details.pid],
          ['http', 'signal', started[3]!.details.pid],
          ['stdio', 'error', started[4]!.details.pid],
        ],
        'the crashed start has no stop',
      );
      const actor = `${os.userInfo().username}@${os.hostname()}`;
      for (const row of [...started, ...stopped]) {
        assert.equal(row.actor, actor);
        assert.equal(row.result, row.details.reason === 'error' ? 'error' : 'ok');
        assert.equal(row.details.host, os.hostname());
      }
      for (const row of stopped) assert.equal(typeof row.details.uptime_s, 'number');
      const pkg = JSON.parse(fs.readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
        version: string;
      };
      for (const row of started) {
        assert.equal(row.details.version, pkg.version);
        assert.equal(row.details.database, kind);
        assert.match(String(row.details.signing_key_id), /^[0-9a-f]{16}$/);
        assert.match(String(row.details.config_sha256), /^[0-9a-f]{64}$/);
      }
      const digests = started.map((r) => r.details.config_sha256);
      assert.equal(digests[1], digests[0], 'the same settings, the same digest (the token is no setting)');
      assert.equal(digests[2], digests[0]);
      assert.notEqual(digests[3], digests[0], 'a changed setting changes the digest');
      assert.ok(!text.includes(WEBHOOK_SECRET) && !text.includes('SECRET'), 'no secret in the log');
      // Each stop follows its own start.
      assert.ok(stopped[0]!.seq > started[0]!.seq && stopped[0]!.seq < started[1]!.seq);
    });
  });
}
