import fs from 'node:fs';
import { z } from 'zod';
import type { Logger } from '../../log.ts';
import { Checkpoint, type Anchorer } from '../checkpoints.ts';
import type { Queryable } from '../../db/knex.ts';
import { anchors } from '../store/index.ts';
import { parseCertificates, requestTimeStamp } from './tsa.ts';
import { statementBytes, writeWitness } from './witness.ts';

/** A checkpoint as signed, with an RFC 3161 time-stamp token (DER, base64) over its statement. */
export const Anchor = z.object({ type: z.literal('tsa'), checkpoint: Checkpoint, token: z.string() });
export type Anchor = z.infer<typeof Anchor>;

export interface AnchorSettings {
  tsa_url?: string;
  tsa_cert_path?: string;
  tsa_timeout_ms: number;
  tsa_max_skew_s?: number;
  witness_dir?: string;
}

/**
 * Time-stamps each new checkpoint at the configured authority, stores the token (audit_anchors) and, with a
 * witness directory, writes it there too. An authority that cannot be reached or answers wrongly leaves the
 * checkpoint unanchored, logged; it never stops a checkpoint or an export.
 */
export function createAnchorer(
  knex: Queryable,
  settings: AnchorSettings,
  log?: Logger,
): Anchorer | undefined {
  const url = settings.tsa_url;
  if (!url) return undefined;
  const trusted = settings.tsa_cert_path
    ? parseCertificates(fs.readFileSync(settings.tsa_cert_path, 'utf8'))
    : undefined;
  return async (checkpoint) => {
    try {
      const { token } = await requestTimeStamp(url, statementBytes(checkpoint), {
        trusted,
        timeoutMs: settings.tsa_timeout_ms,
        signedAt: new Date(checkpoint.ts),
        maxSkewS: settings.tsa_max_skew_s,
      });
      await anchors.insert(knex, { type: 'tsa', ...checkpoint, token });
      if (settings.witness_dir) writeWitness(settings.witness_dir, { checkpoint, tsa_token: token });
    } catch (err) {
      log?.warn({ err, seq: checkpoint.seq }, 'checkpoint not time-stamped: it stays unanchored');
    }
  };
}

const AnchorRow = Checkpoint.extend({ type: z.literal('tsa'), token: z.string() });

/** The stored anchors of checkpoints from `fromSeq` to `toSeq`, by seq, page by page. */
export async function* storedAnchors(
  knex: Queryable,
  fromSeq: number,
  toSeq: number,
): AsyncGenerator<Anchor> {
  for (let afterId = 0; ;) {
    const rows = await anchors.page(knex, afterId, fromSeq, toSeq, 1000);
    for (const raw of rows) {
      const { type, token, ...checkpoint } = AnchorRow.parse(raw);
      yield { type, checkpoint, token };
    }
    if (rows.length < 1000) return;
    afterId = Number(rows.at(-1)!.id);
  }
}

/**
 * Writes the anchors of an export's range beside it (`FILE.anchors.jsonl`, one anchor per line). Not
 * signed: each anchor carries its own proofs (the checkpoint's Ed25519 signature, the authority's token).
 * Returns the file, or undefined when there is no anchor to carry.
 */
export async function writeAnchorsFile(
  knex: Queryable,
  file: string,
  fromSeq: number,
  toSeq: number,
): Promise<string | undefined> {
  const lines: string[] = [];
  for await (const anchor of storedAnchors(knex, fromSeq, toSeq)) lines.push(JSON.stringify(anchor));
  if (lines.length === 0) return undefined;
  fs.writeFileSync(file, `${lines.join('\n')}\n`, { mode: 0o600 });
  return file;
}

/** The anchors of an anchors file; a line that is not one is reported, not skipped. */
export function readAnchorsFile(file: string): { anchors: Anchor[]; bad: number[] } {
  const anchors: Anchor[] = [];
  const bad: number[] = [];
  fs.readFileSync(file, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (line.trim() === '') return;
      try {
        anchors.push(Anchor.parse(JSON.parse(line)));
      } catch {
        bad.push(i + 1);
      }
    });
  return { anchors, bad };
}
