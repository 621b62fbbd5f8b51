import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import pg from 'pg';
import type { AuditInput } from '../../src/audit/chain.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { headSeq } from '../../src/audit/query.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';
import { figure, type Figure } from '../lib/report.ts';

export interface AppendOptions {
  url: string;
  writers: number;
  seconds: number;
  log(line: string): void;
}

/** 32 random hex digits, as cheaply as Node makes them (randomUUID draws on a cached entropy pool). */
const hex32 = () => randomUUID().replaceAll('-', '');

/**
 * What one read call appends: the same shape the pipeline writes for search_contacts. Every row is
 * distinct, and made in well under a microsecond: the writers' loops measure the log, not the making
 * of test rows (randomBytes took ~8 us a row, time the batched writers spent between their batches).
 */
function callRow(agentId: string): AuditInput {
  return {
    kind: 'tool.call',
    request_id: randomUUID(),
    trace_id: hex32(),
    agent_id: agentId,
    tool: 'isphere_search_contacts',
    source: 'local',
    target_type: null,
    target_ref: null,
    approval_id: null,
    dry_run: false,
    content_sha256: null,
    file_sha256: null,
    result: 'ok',
    error_code: null,
    details: { args_sha256: hex32() + hex32(), duration_ms: 3, count: 10 },
  };
}

/** `writers` loops, each with one append in flight, for `seconds`; rows per second. */
async function run(writers: number, seconds: number, append: (w: number) => Promise<unknown>) {
  const end = performance.now() + seconds * 1000;
  const t0 = performance.now();
  let n = 0;
  await Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      while (performance.now() < end) {
        await append(w);
        n++;
      }
    }),
  );
  return { rows: n, perSecond: n / ((performance.now() - t0) / 1000) };
}

/**
 * How many rows each transaction appended after `afterSeq`: the rows of one transaction share its xmin,
 * so this is the batch size the writers actually got, read from the table rather than from the code.
 */
async function rowsPerTransaction(knex: Knex, afterSeq: number): Promise<string> {
  const { rows } = (await knex.raw(
    'select count(*)::int as n, count(distinct xmin::text)::int as t from audit_events where seq > ?',
    [afterSeq],
  )) as { rows: { n: number; t: number }[] };
  const { n, t } = rows[0]!;
  return `${(n / Math.max(t, 1)).toFixed(2)} rows per transaction (${t} transactions)`;
}

/**
 * (b) audit appends/s with `writers` concurrent writers through the real createAuditLog, against raw
 * INSERTs of the same rows into an unchained copy of the table (one connection per writer), and
 * against chaining one row per lock (each row its own transaction under the advisory lock).
 */
export async function appendFigures(o: AppendOptions): Promise<Figure[]> {
  const db = await openDatabase({ url: o.url, pgliteDir: '', command: 'bench appends' });
  const raw = await Promise.all(
    Array.from({ length: o.writers }, async () => {
      const c = new pg.Client({ connectionString: o.url });
      await c.connect();
      return c;
    }),
  );
  try {
    await migrateLatest(db.knex);
    // Same columns and indexes, no chain and no append-only triggers; seq from an identity.
    await db.knex.raw('create table audit_events_raw (like audit_events including all)');
    await db.knex.raw('alter table audit_events_raw alter column seq add generated always as identity');
    const agentId = randomUUID();
    const cols = Object.keys({ ...callRow(agentId), event_id: 0, ts: 0, prev_hash: 0, hash: 0 });
    const insertRaw = `insert into audit_events_raw (${cols.join(', ')}) values (${cols.map((_, i) => `$${i + 1}`).join(', ')})`;
    const fakeHash = 'f'.repeat(64);
    const rawAppend = (w: number) => {
      const row: Record<string, unknown> = {
        ...callRow(agentId),
        event_id: randomUUID(),
        ts: new Date().toISOString(),
        prev_hash: fakeHash,
        hash: fakeHash,
      };
      row.details = JSON.stringify(row.details);
      return raw[w]!.query(
        insertRaw,
        cols.map((c) => row[c]),
      );
    };
    const log = createAuditLog(db.knex);
    const batched = () => log.append(callRow(agentId));
    const perLock = () => db.knex.transaction((trx) => log.appendIn(trx, callRow(agentId)));

    const variants = { raw: rawAppend, batched, perLock };
    const totals = { raw: { rows: 0, s: 0 }, batched: { rows: 0, s: 0 }, perLock: { rows: 0, s: 0 } };
    const rounds = 2;
    for (let r = 0; r < rounds; r++) {
      for (const [name, fn] of Object.entries(variants) as [
        keyof typeof variants,
        (w: number) => Promise<unknown>,
      ][]) {
        await run(o.writers, Math.min(1, o.seconds / 4), fn); // warm-up
        const before = await headSeq(db.knex);
        const res = await run(o.writers, o.seconds / rounds, fn);
        totals[name].rows += res.rows;
        totals[name].s += res.rows / res.perSecond;
        const batches = name === 'raw' ? '' : `, ${await rowsPerTransaction(db.knex, before)}`;
        o.log(`  ${name.padEnd(8)} round ${r + 1}/${rounds}: ${res.perSecond.toFixed(0)} rows/s${batches}`);
      }
    }
    const rate = (k: keyof typeof totals) => totals[k].rows / totals[k].s;
    const chain = await verifyDatabaseChain(db.knex);
    const note = chain.first_bad
      ? `chain broken at seq ${chain.first_bad.seq}: ${chain.first_bad.fault}`
      : `${chain.valid}/${chain.rows} chained rows verify`;
    return [
      figure({
        id: 'b_audit_appends',
        unit: 'rows/s',
        value: chain.first_bad ? Number.NaN : rate('batched'),
        baseline: rate('raw'),
        baseline_label: `raw INSERTs into an unchained copy, ${o.writers} connections`,
        check: { ratioAtLeast: 0.5 },
        note,
      }),
      figure({
        id: 'b_audit_appends_vs_one_row_per_lock',
        unit: 'rows/s',
        value: rate('batched'),
        baseline: rate('perLock'),
        baseline_label: 'chaining one row per advisory-lock transaction',
        check: { ratioAtLeast: 10 },
      }),
    ];
  } finally {
    await Promise.allSettled(raw.map((c) => c.end()));
    await db.close();
  }
}
