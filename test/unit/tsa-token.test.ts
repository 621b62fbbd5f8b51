import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { checkToken, parseCertificates, requestTimeStamp } from '../../src/audit/anchors/tsa.ts';
import { checkAnchors } from '../../src/audit/anchors/check.ts';
import { statementBytes } from '../../src/audit/anchors/witness.ts';
import { checkpointPayload } from '../../src/audit/checkpoints.ts';
import { loadSigner } from '../../src/audit/signing.ts';
import {
  issueTsaCertificate,
  longLivedTsaCertificate,
  stampToken,
  type TsaSigner,
} from '../helpers/tsa-tokens.ts';
import { startTestTsa, type TestTsa } from '../helpers/tsa.ts';

const DAY_MS = 86_400_000;
const EKU = 'keyUsage = critical,digitalSignature\nextendedKeyUsage = critical,timeStamping';

describe('time-stamp tokens checked as RFC 3161 and RFC 5280 ask', () => {
  let dir: string;
  let tsa: TestTsa;
  let trusted: ReturnType<typeof parseCertificates>;
  const signer = () => loadSigner(dir);
  /** A checkpoint of this log signed at `ts`, as the chain records it. */
  const checkpointAt = (ts: Date) => {
    const statement = { origin: 'test-origin', seq: 7, head_hash: 'a'.repeat(64), ts: ts.toISOString() };
    const s = signer();
    return {
      ...statement,
      key_id: s.key_id,
      public_key: s.public_key,
      signature: s.sign(checkpointPayload(statement)),
    };
  };
  const signers: Record<string, TsaSigner> = {};

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-tsa-token-'));
    tsa = await startTestTsa(path.join(dir, 'tsa'));
    trusted = parseCertificates(fs.readFileSync(tsa.caCert, 'utf8'));
    signers.good = await issueTsaCertificate(tsa, 'good', EKU);
    signers.noEku = await issueTsaCertificate(tsa, 'no-eku', 'keyUsage = critical,digitalSignature');
    signers.otherEku = await issueTsaCertificate(tsa, 'other-eku', 'extendedKeyUsage = critical,codeSigning');
    signers.nonCritical = await issueTsaCertificate(tsa, 'non-critical', 'extendedKeyUsage = timeStamping');
  });
  after(async () => {
    await tsa?.close();
  });

  /** The check of a token `signer` dates `genTime` over a checkpoint signed at `signedAt`. */
  async function check(who: TsaSigner, genTime: Date, signedAt = genTime, maxSkewS?: number) {
    const checkpoint = checkpointAt(signedAt);
    const statement = statementBytes(checkpoint);
    const token = await stampToken(who, statement, genTime);
    return checkToken(token, statement, { trusted, signedAt, maxSkewS });
  }

  it('accepts a token of a certificate with the critical time-stamping EKU, valid then, near its checkpoint', async () => {
    const now = new Date();
    const result = await check(signers.good!, now, new Date(now.getTime() - 5_000));
    assert.equal(result.ok, true, JSON.stringify(result));
  });

  it('refuses a token signed by a certificate without the time-stamping EKU', async () => {
    for (const who of [signers.noEku!, signers.otherEku!]) {
      const result = await check(who, new Date());
      assert.equal(result.ok, false);
      assert.equal(!result.ok && result.problem, 'no_timestamping_eku');
    }
  });

  it('refuses a token signed by a certificate whose time-stamping EKU is not critical', async () => {
    const result = await check(signers.nonCritical!, new Date());
    assert.equal(!result.ok && result.problem, 'eku_not_critical');
  });

  it('refuses a token dated after its certificate expired', async () => {
    const later = new Date(Date.now() + 5 * DAY_MS); // the certificate is valid for two days from now
    const result = await check(signers.good!, later);
    assert.equal(!result.ok && result.problem, 'certificate_not_valid_at_gentime');
  });

  it('refuses a token dated 2001 over a 2026 checkpoint, and one outside the configured bound', async () => {
    const old = await check(signers.good!, new Date('2001-06-01T00:00:00Z'), new Date());
    assert.equal(old.ok, false);
    // Dated before its certificate existed: the certificate's validity is what fails first.
    assert.equal(!old.ok && old.problem, 'certificate_not_valid_at_gentime');
    const now = new Date();
    const late = await check(signers.good!, now, new Date(now.getTime() - 2 * 3600_000));
    assert.equal(!late.ok && late.problem, 'gentime_out_of_bound');
    const tight = await check(signers.good!, now, new Date(now.getTime() - 120_000), 60);
    assert.equal(!tight.ok && tight.problem, 'gentime_out_of_bound');
    const loose = await check(signers.good!, now, new Date(now.getTime() - 2 * 3600_000), 3 * 3600);
    assert.equal(loose.ok, true, JSON.stringify(loose));
  });

  it('refuses a token dated 2001 over a 2026 checkpoint even from a pinned certificate valid in 2001', async () => {
    const pinned = await longLivedTsaCertificate(dir);
    const pin = parseCertificates(fs.readFileSync(pinned.cert, 'utf8'));
    const ts = new Date('2026-12-01T00:00:00Z');
    const checkpoint = checkpointAt(ts);
    const stamp = (genTime: Date) => stampToken(pinned, statementBytes(checkpoint), genTime);
    const honest = await checkToken(await stamp(new Date(ts.getTime() + 2_000)), statementBytes(checkpoint), {
      trusted: pin,
      signedAt: ts,
    });
    assert.equal(honest.ok, true, JSON.stringify(honest));
    const backdated = await checkToken(
      await stamp(new Date('2001-06-01T00:00:00Z')),
      statementBytes(checkpoint),
      {
        trusted: pin,
        signedAt: ts,
      },
    );
    assert.equal(!backdated.ok && backdated.problem, 'gentime_out_of_bound');
  });

  it('names the reason in the anchors report', async () => {
    const checkpoint = checkpointAt(new Date());
    const token = await stampToken(signers.nonCritical!, statementBytes(checkpoint), new Date());
    const report = await checkAnchors({
      origin: checkpoint.origin,
      tsaCerts: trusted,
      anchors: [{ type: 'tsa', checkpoint, token: token.toString('base64') }],
      end: { seq: checkpoint.seq, live: true },
      hashesAt: async () => new Map([[checkpoint.seq, checkpoint.head_hash]]),
    });
    assert.equal(report.ok, false);
    assert.ok(
      report.findings.some((f) => f.problem === 'bad_token' && /eku_not_critical/.test(f.detail)),
      JSON.stringify(report.findings),
    );
  });

  it("still takes the real authority's replies (openssl ts), checked on arrival against its checkpoint's time", async () => {
    const checkpoint = checkpointAt(new Date());
    const { genTime } = await requestTimeStamp(tsa.url, statementBytes(checkpoint), {
      trusted,
      timeoutMs: 10_000,
      signedAt: new Date(checkpoint.ts),
    });
    assert.ok(genTime instanceof Date);
    await assert.rejects(
      requestTimeStamp(tsa.url, statementBytes(checkpoint), {
        trusted,
        timeoutMs: 10_000,
        signedAt: new Date('2001-06-01T00:00:00Z'),
      }),
      (err: Error & { reason?: string }) =>
        err.reason === 'tsa_reply_invalid' && /gentime_out_of_bound/.test(err.message),
    );
  });
});
