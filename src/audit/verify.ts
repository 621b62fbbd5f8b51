import type { Knex } from 'knex';
import { chainHash, GENESIS_HASH, rowFromDb, type AuditRow } from './chain.ts';

export type ChainFault = 'hash_mismatch' | 'prev_hash_mismatch' | 'gap' | 'reordered';

export interface ChainReport {
  rows: number;
  valid: number;
  head_seq: number;
  head_hash: string;
  first_bad?: { seq: number; fault: ChainFault; detail: string };
}

/** Checks rows in order, stopping at the first one that breaks the chain. */
export class ChainVerifier {
  private prevHash = GENESIS_HASH;
  private prevSeq = 0;
  readonly report: ChainReport = { rows: 0, valid: 0, head_seq: 0, head_hash: GENESIS_HASH };

  constructor(start?: { seq: number; hash: string }) {
    if (start) {
      this.prevSeq = start.seq;
      this.prevHash = start.hash;
    }
  }

  /** Returns false once a fault has been found. */
  push(row: AuditRow): boolean {
    this.report.rows++;
    if (this.report.first_bad) return false;
    const fault = this.check(row);
    if (fault) {
      this.report.first_bad = { seq: row.seq, ...fault };
      return false;
    }
    this.report.valid++;
    this.prevSeq = row.seq;
    this.prevHash = row.hash;
    this.report.head_seq = row.seq;
    this.report.head_hash = row.hash;
    return true;
  }

  private check(row: AuditRow): { fault: ChainFault; detail: string } | undefined {
    if (row.seq !== this.prevSeq + 1) {
      return row.seq <= this.prevSeq
        ? { fault: 'reordered', detail: `seq ${row.seq} follows seq ${this.prevSeq}` }
        : { fault: 'gap', detail: `seq ${this.prevSeq + 1}..${row.seq - 1} missing` };
    }
    if (row.prev_hash !== this.prevHash) {
      return {
        fault: 'prev_hash_mismatch',
        detail: `prev_hash does not match the hash of seq ${this.prevSeq}`,
      };
    }
    if (chainHash(row.prev_hash, row) !== row.hash) {
      return { fault: 'hash_mismatch', detail: 'row content does not match its hash' };
    }
    return undefined;
  }
}

/** Verifies the live table in pages of `pageSize` rows. */
export async function verifyDatabaseChain(knex: Knex, pageSize = 5000): Promise<ChainReport> {
  const verifier = new ChainVerifier();
  let after = 0;
  for (;;) {
    const page = await knex('audit_events').where('seq', '>', after).orderBy('seq').limit(pageSize);
    for (const raw of page) {
      if (!verifier.push(rowFromDb(raw))) return verifier.report;
    }
    if (page.length < pageSize) return verifier.report;
    after = Number(page.at(-1)!.seq);
  }
}
