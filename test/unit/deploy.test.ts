import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { parse, parseAllDocuments } from 'yaml';
import { INPUTS } from '../../scripts/build-inputs.ts';
import { ENV_KEYS } from '../../src/config.ts';

/**
 * The deployment files (compose.yaml, deploy/kubernetes/) as the engines read them: every variable they
 * set is one countersign reads, the replicas share the secrets, and the balancer and the probes ask
 * /healthz. The stack itself runs in scripts/container-smoke.sh.
 */

// The host roots file, shared by every replica.
/** Whether countersign reads this variable: a config key or its _FILE form. */
const known = (name: string) => name in ENV_KEYS || name.replace(/_FILE$/, '') in ENV_KEYS;

const SHARED = {
  DATABASE_URL_FILE: '/etc/countersign/shared/database-url',
  COUNTERSIGN_AUDIT_SIGNING_KEY: '/etc/countersign/shared/audit-signing-key.pem',
  COUNTERSIGN_HOST_ROOTS: '/etc/countersign/shared/host-roots.json',
};

const ROOT = path.resolve(import.meta.dirname, '../..');

type Doc = Record<string, unknown>;
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- manifests are read field by field
type Loose = any;

describe('Containerfile', () => {
  // The image's build step runs scripts/build.ts on what the build context holds: every input of the
  // build must pass .dockerignore and be copied in (scripts/build-inputs.ts was once missing from both).
  it('copies every input of the build into its build stage, and .dockerignore lets each through', () => {
    const allowed = fs
      .readFileSync(path.join(ROOT, '.dockerignore'), 'utf8')
      .split('\n')
      .filter((line) => line.startsWith('!'))
      .map((line) => line.slice(1).replace(/\/$/, ''));
    const buildStage = fs.readFileSync(path.join(ROOT, 'Containerfile'), 'utf8').split(/^FROM /m)[1] ?? '';
    const copied = [...buildStage.matchAll(/^COPY (?!--from)(.+) \S+$/gm)].flatMap((m) => m[1]!.split(/\s+/));
    for (const input of INPUTS) {
      assert.ok(allowed.includes(input), `.dockerignore lets ${input} through`);
      assert.ok(copied.includes(input), `the Containerfile's build stage copies ${input}`);
    }
  });
});

describe('compose.yaml', () => {
  const compose = parse(fs.readFileSync(path.join(ROOT, 'compose.yaml'), 'utf8'), { merge: true }) as Loose;
  const replicas = Object.keys(compose.services).filter((s) => /^countersign-\d+$/.test(s));

  it('runs three replicas sharing the secrets of one volume, made by init', () => {
    assert.deepEqual(replicas, ['countersign-1', 'countersign-2', 'countersign-3']);
    for (const name of replicas) {
      const service = compose.services[name];
      const env = service.environment as Record<string, string>;
      assert.deepEqual(
        Object.keys(env).filter((k) => !known(k)),
        [],
        `${name}: unknown variables`,
      );
      for (const [key, value] of Object.entries(SHARED)) assert.equal(env[key], value, `${name}: ${key}`);
      assert.ok(service.volumes.includes('shared:/etc/countersign/shared:ro'));
      assert.equal(service.depends_on.init.condition, 'service_completed_successfully');
    }
    assert.ok(compose.services.init.volumes.includes('shared:/etc/countersign/shared'));
    assert.equal(
      compose.services.db.environment.POSTGRES_PASSWORD_FILE,
      '/etc/countersign/shared/db-password',
    );
  });

  it('balances over every replica, each checked on /healthz', () => {
    const cfg = fs.readFileSync(path.join(ROOT, 'deploy/compose/haproxy.cfg'), 'utf8');
    const servers = [...cfg.matchAll(/^\s*server (\S+) (\S+):8787$/gm)].map((m) => [m[1], m[2]]);
    assert.deepEqual(
      servers,
      replicas.map((r) => [r, r]),
    );
    assert.match(cfg, /^\s*http-check send meth GET uri \/healthz .*hdr Host localhost$/m);
    assert.match(cfg, /^\s*http-check expect status 200$/m);
    assert.match(cfg, /^\s*default-server check /m);
  });
});

describe('deploy/kubernetes', () => {
  const dir = path.join(ROOT, 'deploy/kubernetes');
  const read = (file: string) => parse(fs.readFileSync(path.join(dir, file), 'utf8')) as Loose;
  const kustomization = read('kustomization.yaml');
  const docs = (kustomization.resources as string[]).map(read);
  const ofKind = (kind: string) => docs.find((d: Doc) => d.kind === kind);

  it('holds a Deployment, a Service, a PodDisruptionBudget and the shared Secret', () => {
    assert.deepEqual(docs.map((d: Doc) => d.kind).sort(), ['Deployment', 'PodDisruptionBudget', 'Service']);
    const secret = kustomization.secretGenerator.find((g: Doc) => g.name === 'countersign-shared');
    const keys = (secret.literals as string[]).map((l) => l.split('=')[0]);
    assert.deepEqual(keys.sort(), ['audit-signing-key.pem', 'database-url', 'host-roots.json']);
  });

  it('runs the image as it is built, reading the shared secrets, probed on /healthz', () => {
    const deployment = ofKind('Deployment');
    const pod = deployment.spec.template.spec;
    const container = pod.containers[0];
    assert.equal(container.command, undefined, "the image's command, with npm start's node options");
    assert.equal(container.args, undefined);
    assert.equal(pod.securityContext.runAsNonRoot, true);
    const env = Object.fromEntries(container.env.map((e: Doc) => [e.name, e.value])) as Record<
      string,
      string
    >;
    assert.deepEqual(
      Object.keys(env).filter((k) => !known(k)),
      [],
    );
    for (const [key, value] of Object.entries(SHARED)) assert.equal(env[key], value, key);
    const shared = pod.volumes.find((v: Loose) => v.secret?.secretName === 'countersign-shared');
    assert.ok(shared);
    assert.deepEqual(
      container.volumeMounts.find((m: Doc) => m.name === shared.name),
      { name: shared.name, mountPath: '/etc/countersign/shared', readOnly: true },
    );
    for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
      assert.equal(container[probe].httpGet.path, '/healthz', probe);
      assert.deepEqual(container[probe].httpGet.httpHeaders, [{ name: 'Host', value: 'localhost' }]);
    }
    // The heap cap of the image's node options (512 MB) fits under the limit, with room for the rest.
    assert.match(container.resources.requests.memory, /^\d+Mi$/);
    assert.ok(parseInt(container.resources.limits.memory) > 512);
  });

  it('selects the same pods from the Service, the budget and the Deployment', () => {
    const labels = ofKind('Deployment').spec.template.metadata.labels;
    const selectors = [
      ofKind('Service').spec.selector,
      ofKind('PodDisruptionBudget').spec.selector.matchLabels,
    ];
    for (const selector of [...selectors, ofKind('Deployment').spec.selector.matchLabels]) {
      for (const [k, v] of Object.entries(selector)) assert.equal(labels[k], v);
    }
  });

  // kubectl is on the CI machines; elsewhere this part says why it did not run.
  const hasKubectl = !spawnSync('kubectl', ['version', '--client'], { encoding: 'utf8' }).error;
  it(
    'renders with kustomize (kubectl kustomize)',
    { skip: !hasKubectl && process.env.CI !== 'true' && 'needs kubectl, to run kubectl kustomize' },
    () => {
      const run = spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8' });
      assert.equal(run.status, 0, run.stderr);
      const rendered = parseAllDocuments(run.stdout).map((d) => d.toJS() as Doc);
      assert.deepEqual(rendered.map((d) => d.kind).sort(), [
        'Deployment',
        'PodDisruptionBudget',
        'Secret',
        'Service',
      ]);
      const deployment = rendered.find((d) => d.kind === 'Deployment') as Loose;
      const secret = rendered.find((d) => d.kind === 'Secret') as Loose;
      // The generated Secret's name (with its hash) is the one the pods mount.
      assert.ok(
        deployment.spec.template.spec.volumes.some(
          (v: Loose) => v.secret?.secretName === secret.metadata.name,
        ),
      );
    },
  );
});
