import type { Queryable } from '../db/knex.ts';
import { AuditRowFromDb, chainHash, GENESIS_HASH, type AuditRow } from './chain.ts';
import { CheckpointRows, type CheckpointTrust } from './chain-checkpoints.ts';
import { events } from './store/index.ts';

/**
 * malformed: a stored row that is not an audit row at all (a value no append writes). checkpoint: a
 * `checkpoint` row that contradicts the chain before it or the log's key (see chain-checkpoints.ts).
 */
export type ChainFault =
  'hash_mismatch' | 'prev_hash_mismatch' | 'gap' | 'reordered' | 'malformed' | 'checkpoint' | RowMacFault;

/**
 * A stored row from the pinned seq on without its row MAC (row_unsigned), or with one the host's row key
 * did not make (row_mac_mismatch): a row the server did not append, whatever its hash.
 */
export type RowMacFault = 'row_unsigned' | 'row_mac_mismatch';

/** The host's check of stored rows' MACs (host roots): required from seq `from` on. */
export interface RowMacCheck {
  from: number;
  verify(hash: string, mac: string): boolean;
}

/** Why a stored row's MAC is not the host's; undefined when it is, or when none is required yet. */
export function rowMacFault(
  check: RowMacCheck,
  row: { seq: number; hash: string },
  mac: unknown,
): { fault: RowMacFault; detail: string } | undefined {
  if (row.seq < check.from) return undefined;
  if (typeof mac !== 'string' || mac === '')
    return {
      fault: 'row_unsigned',
      detail: `row ${row.seq} carries no row MAC: the server did not append it`,
    };
  if (!check.verify(row.hash, mac))
    return {
      fault: 'row_mac_mismatch',
      detail: `row ${row.seq}'s MAC is not the host's: the server did not append it`,
    };
  return undefined;
}

export interface ChainReport {
  rows: number;
  valid: number;
  head_seq: number;
  head_hash: string;
  first_bad?: { seq: number; fault: ChainFault; detail: string };
}

/** Where a row that does not parse sits, for its report. */
const StoredSeq = AuditRowFromDb.pick({ seq: true });

/**
 * Checks rows in order, stopping at the first one that breaks the chain. Given the log's key, it also
 * checks every `checkpoint` row against the chain before it (`checkpoints`).
 */
export class ChainVerifier {
  private prevHash = GENESIS_HASH;
  private prevSeq = 0;
  readonly report: ChainReport = { rows: 0, valid: 0, head_seq: 0, head_hash: GENESIS_HASH };
  readonly checkpoints: CheckpointRows | undefined;

  constructor(
    start?: { seq: number; hash: string },
    trust?: CheckpointTrust,
    /** Stored rows only: the host's row MACs, checked from their pinned seq on. */
    private readonly rowMacs?: RowMacCheck,
  ) {
    if (start) {
      this.prevSeq = start.seq;
      this.prevHash = start.hash;
    }
    if (trust) this.checkpoints = new CheckpointRows(trust);
  }

  /** Returns false once a fault has been found. */
  push(row: AuditRow, mac?: unknown): boolean {
    this.report.rows++;
    if (this.report.first_bad) return false;
    const fault = this.check(row) ?? (this.rowMacs && rowMacFault(this.rowMacs, row, mac));
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

  /**
   * Pushes a row as the database returns it. One that does not parse is a fault at its seq, like any
   * other change to a stored row, rather than an error that stops the verification.
   */
  pushStored(raw: unknown): boolean {
    const parsed = AuditRowFromDb.safeParse(raw);
    if (parsed.success) return this.push(parsed.data, (raw as { row_mac?: unknown }).row_mac);
    this.report.rows++;
    const issue = parsed.error.issues[0]!;
    this.report.first_bad ??= {
      seq: StoredSeq.safeParse(raw).data?.seq ?? this.prevSeq + 1,
      fault: 'malformed',
      detail: `${issue.path.join('.') || 'row'}: ${issue.message}`,
    };
    return false;
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
    if (row.kind === 'checkpoint' && this.checkpoints && !this.checkpoints.push(row)) {
      return { fault: 'checkpoint', detail: this.checkpoints.first_bad!.detail };
    }
    return undefined;
  }
}

/**
 * Verifies the live table in pages of `pageSize` rows; with the log's key, its checkpoint rows too
 * (`verifier.checkpoints` then tells how far the chain is anchored).
 */
export async function verifyDatabaseChain(
  knex: Queryable,
  pageSize = 5000,
  verifier = new ChainVerifier(),
  onRow?: (row: { seq: number; hash: string; kind: unknown }) => void,
): Promise<ChainReport> {
  let after = 0;
  for (;;) {
    const page = await events.rowsAfter(knex, after, pageSize);
    for (const raw of page) {
      if (!verifier.pushStored(raw)) return verifier.report;
      onRow?.(raw);
    }
    if (page.length < pageSize) return verifier.report;
    after = Number(page.at(-1)!.seq);
  }
}
