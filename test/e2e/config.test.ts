import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { loadConfig } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import { runCli } from '../helpers/cli.ts';

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-config-'));

describe('configuration', () => {
  it('has working defaults: embedded database under ./data, loopback on 8787', () => {
    const cwd = tmp();
    const config = loadConfig({}, cwd);
    assert.equal(config.data_dir, path.join(cwd, 'data'));
    assert.equal(config.pglite_dir, path.join(cwd, 'data', 'pglite'));
    assert.equal(config.database_url, undefined);
    assert.equal(config.http.host, '127.0.0.1');
    assert.equal(config.http.port, 8787);
    assert.equal(config.tools.prefix, 'isphere_');
    assert.equal(config.files.download_dir, path.join(cwd, 'data', 'downloads'));
    assert.equal(config.files.max_file_bytes, 25 * 1024 * 1024);
    assert.ok(Object.isFrozen(config) && Object.isFrozen(config.http));
  });

  it("defaults the hostile callers' bounds as docs/operations.md says", () => {
    const cwd = tmp();
    fs.writeFileSync(
      path.join(cwd, 'countersign.config.json'),
      JSON.stringify({ upstreams: [{ name: 'fs', url: 'http://a.test/mcp' }] }),
    );
    const config = loadConfig({}, cwd);
    assert.equal(config.upstreams[0]!.max_result_bytes, 8 * 1024 * 1024);
    assert.equal(config.audit.denied_rows_per_minute, 10);
    assert.equal(config.audit.refusals_per_second_per_address, 100);
    assert.equal(config.http.max_streams_per_agent, 8);
    assert.equal(config.web.login_failures_per_user, 5);
    assert.equal(config.web.login_failures_per_ip, 20);
  });

  it('refuses a DATABASE_URL that names no database, showing how to name one', () => {
    const cwd = tmp();
    for (const url of [
      'postgres://app@db.test:5432',
      'postgres://app@db.test:5432/',
      'postgresql://db.test',
    ]) {
      assert.throws(
        () => loadConfig({ DATABASE_URL: url }, cwd),
        (err: unknown) =>
          isAppError(err, 'CONFIG_INVALID', 'config') &&
          /"database_url" \(env DATABASE_URL\)/.test(err.message) &&
          /maintenance database "postgres"/.test(err.message) &&
          err.message.includes('/countersign'),
        url,
      );
    }
    for (const url of ['postgres://app@db.test:5432/countersign', 'postgres://db.test:5432/?database=cs']) {
      assert.equal(loadConfig({ DATABASE_URL: url }, cwd).database_url, url);
    }
  });

  it('reads countersign.config.json, and the environment wins over it', () => {
    const cwd = tmp();
    fs.writeFileSync(
      path.join(cwd, 'countersign.config.json'),
      JSON.stringify({ http: { port: 9000, host: '127.0.0.2' }, tools: { prefix: 'acme_' } }),
    );
    const config = loadConfig({ COUNTERSIGN_PORT: '9100', COUNTERSIGN_ALLOWED_HOSTS: 'a.test, b.test' }, cwd);
    assert.equal(config.http.port, 9100);
    assert.equal(config.http.host, '127.0.0.2');
    assert.equal(config.tools.prefix, 'acme_');
    assert.deepEqual(config.http.allowed_hosts, ['a.test', 'b.test']);
  });

  it('names the key of a bad value', () => {
    const cwd = tmp();
    const cases: [Record<string, string>, RegExp][] = [
      [{ COUNTERSIGN_PORT: 'eighty' }, /COUNTERSIGN_PORT: expected an integer/],
      [{ COUNTERSIGN_PORT: '70000' }, /"http\.port" \(env COUNTERSIGN_PORT\)/],
      [{ DATABASE_URL: 'mysql://x' }, /"database_url" \(env DATABASE_URL\)/],
      [{ LOG_LEVEL: 'loud' }, /"log_level"/],
      [{ COUNTERSIGN_DEMO: 'maybe' }, /COUNTERSIGN_DEMO: expected true or false/],
      [{ COUNTERSIGN_CONFIG: 'missing.json' }, /cannot read config file/],
    ];
    for (const [env, message] of cases) {
      assert.throws(
        () => loadConfig(env, cwd),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID', 'config') && message.test(err.message),
      );
    }
    fs.writeFileSync(path.join(cwd, 'countersign.config.json'), JSON.stringify({ http: { prot: 1 } }));
    assert.throws(() => loadConfig({}, cwd), /"http"|prot/);
    fs.writeFileSync(path.join(cwd, 'countersign.config.json'), '{ not json');
    assert.throws(() => loadConfig({}, cwd), /not valid JSON/);
  });

  it('reads approval rules from the file, naming the key of a malformed one', () => {
    const cwd = tmp();
    const file = path.join(cwd, 'countersign.config.json');
    const rule = { name: 'r', when: 'true', then: { require: { approvers: 2 } } };
    fs.writeFileSync(file, JSON.stringify({ approval: { rules: { rules: [rule] } } }));
    const config = loadConfig({}, cwd);
    assert.deepEqual(config.approval.rules, { timezone: 'UTC', rules: [rule] });
    assert.ok(Object.isFrozen(config.approval.rules.rules[0]));
    assert.deepEqual(loadConfig({}, tmp()).approval.rules, { timezone: 'UTC', rules: [] });
    fs.writeFileSync(
      file,
      JSON.stringify({ approval: { rules: { rules: [{ ...rule, then: { require: { approvers: 9 } } }] } } }),
    );
    assert.throws(
      () => loadConfig({}, cwd),
      (err: unknown) =>
        isAppError(err, 'CONFIG_INVALID', 'config') && /"approval\.rules\.rules\.0\.then/.test(err.message),
    );
  });

  it('validates upstream entries, naming the entry and the problem', () => {
    const cwd = tmp();
    const file = path.join(cwd, 'countersign.config.json');
    const cases: [unknown[], RegExp][] = [
      [[{ name: 'fs', command: 'x', url: 'http://a.test/mcp' }], /"upstreams\.0": give either "command"/],
      [[{ name: 'fs' }], /"upstreams\.0": give either "command"/],
      [
        [{ name: 'fs', url: 'http://a.test/mcp', args: ['-y'] }],
        /"upstreams\.0\.args": "args" belongs to a stdio/,
      ],
      [[{ name: 'Files', command: 'x' }], /"upstreams\.0\.name": lowercase/],
      [
        [
          { name: 'fs', command: 'x' },
          { name: 'fs', url: 'http://a.test' },
        ],
        /"upstreams": upstream names must be unique/,
      ],
      [[{ name: 'fs', command: 'x', tools: { rm: 'maybe' } }], /"upstreams\.0\.tools\.rm"/],
      [[{ name: 'fs', command: 'x', timeout_ms: 30_000 }], /"upstreams\.0\.timeout_ms": must be below/],
    ];
    for (const [upstreams, message] of cases) {
      fs.writeFileSync(file, JSON.stringify({ upstreams }));
      assert.throws(
        () => loadConfig({}, cwd),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID', 'config') && message.test(err.message),
        JSON.stringify(upstreams),
      );
    }
    fs.writeFileSync(
      file,
      JSON.stringify({
        upstreams: [{ name: 'fs', command: 'npx', args: ['-y', 'pkg'], tools: { rm: 'hidden' } }],
      }),
    );
    const config = loadConfig({}, cwd);
    assert.equal(config.upstreams[0]?.command, 'npx');
    assert.deepEqual(config.upstreams[0]?.tools, { rm: 'hidden' });
    assert.throws(() => loadConfig({ COUNTERSIGN_DEFAULT_SOURCE: 'bridge' }, cwd), /"bridge\.url"/);
    assert.throws(
      () =>
        loadConfig({ COUNTERSIGN_BRIDGE_URL: 'http://b.test', COUNTERSIGN_BRIDGE_TIMEOUT_MS: '30000' }, cwd),
      /"bridge\.timeout_ms" \(env COUNTERSIGN_BRIDGE_TIMEOUT_MS\): must be below/,
    );
  });

  it('reads a secret from the file its _FILE variable names, one trailing newline dropped', () => {
    const cwd = tmp();
    fs.writeFileSync(path.join(cwd, 'db-url'), 'postgres://app:s3cret@db:5432/countersign\n');
    fs.writeFileSync(path.join(cwd, 'webhook'), 'a-webhook-secret-of-32-characters\n\n');
    fs.writeFileSync(path.join(cwd, 'port'), '9000');
    const config = loadConfig(
      {
        DATABASE_URL_FILE: 'db-url',
        COUNTERSIGN_WEBHOOK_URL: 'https://hooks.example.com/x',
        COUNTERSIGN_WEBHOOK_SECRET_FILE: path.join(cwd, 'webhook'),
        COUNTERSIGN_PORT_FILE: 'port',
      },
      cwd,
    );
    assert.equal(config.database_url, 'postgres://app:s3cret@db:5432/countersign');
    assert.equal(config.web.webhook_secret, 'a-webhook-secret-of-32-characters\n');
    assert.equal(config.http.port, 9000);
    // An empty _FILE variable is unset: the plain variable is read.
    assert.equal(loadConfig({ COUNTERSIGN_PORT: '9001', COUNTERSIGN_PORT_FILE: '' }, cwd).http.port, 9001);
  });

  it('refuses a key given both ways, and a _FILE it cannot read, naming the variables', () => {
    const cwd = tmp();
    fs.writeFileSync(path.join(cwd, 'db-url'), 'postgres://app:x@db:5432/c');
    const isConfigError = (names: string[]) => (err: unknown) =>
      isAppError(err, 'CONFIG_INVALID', 'config') && names.every((n) => err.message.includes(n));
    assert.throws(
      () => loadConfig({ DATABASE_URL: 'postgres://a@b/c', DATABASE_URL_FILE: 'db-url' }, cwd),
      isConfigError(['DATABASE_URL ', 'DATABASE_URL_FILE']),
    );
    assert.throws(
      () => loadConfig({ COUNTERSIGN_METRICS_TOKEN_FILE: 'missing' }, cwd),
      isConfigError(['COUNTERSIGN_METRICS_TOKEN_FILE', 'missing', 'ENOENT']),
    );
    assert.throws(() => loadConfig({ COUNTERSIGN_METRICS_TOKEN_FILE: cwd }, cwd), isConfigError(['EISDIR']));
    // An empty file (a placeholder never filled in) is not "unset": DATABASE_URL would fall back to PGlite.
    fs.writeFileSync(path.join(cwd, 'empty'), '\n');
    assert.throws(
      () => loadConfig({ DATABASE_URL_FILE: 'empty' }, cwd),
      isConfigError(['DATABASE_URL_FILE', 'empty']),
    );
    // The file's content goes through the key's own checks.
    fs.writeFileSync(path.join(cwd, 'port'), 'eighty\n');
    assert.throws(
      () => loadConfig({ COUNTERSIGN_PORT_FILE: 'port' }, cwd),
      isConfigError(['COUNTERSIGN_PORT']),
    );
  });

  it('refuses a data directory it cannot write, before opening anything, with exit 1', async () => {
    const parent = tmp();
    const file = path.join(parent, 'a-file');
    fs.writeFileSync(file, '');
    // Under a file: it cannot be made. The file itself: it is not a directory to write in.
    for (const dataDir of [path.join(file, 'data'), file]) {
      const res = await runCli(['serve'], { COUNTERSIGN_DATA_DIR: dataDir, COUNTERSIGN_PORT: '0' });
      assert.equal(res.code, 1);
      assert.match(res.stderr, /configuration error: .*COUNTERSIGN_DATA_DIR.*not writable/);
      assert.doesNotMatch(res.stderr, /countersign listening/);
    }
    assert.deepEqual(fs.readdirSync(parent), ['a-file']);
  });

  it('stops start-up with exit 1 and names the key', async () => {
    const res = await runCli(['serve'], { COUNTERSIGN_DATA_DIR: tmp(), COUNTERSIGN_PORT: 'x' });
    assert.equal(res.code, 1);
    assert.match(res.stderr, /configuration error: COUNTERSIGN_PORT/);
  });
});
