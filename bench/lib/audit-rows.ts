import { createHash, randomUUID } from 'node:crypto';
import pg from 'pg';
import { chainHash, GENESIS_HASH, type AuditBody } from '../../src/audit/chain.ts';
import { EXPORT_COLUMNS } from '../../src/audit/format.ts';
import type { AuditKind } from '../../src/core/audit-kinds.ts';
import { copyIn } from './copy.ts';

const TOOLS = [
  'isphere_search_contacts',
  'isphere_receive_messages',
  'isphere_search_groups',
  'isphere_get_approval',
];
const AGENTS = Array.from({ length: 5 }, () => randomUUID());
const hex = (n: number, bytes = 32) =>
  createHash('sha256')
    .update(String(n))
    .digest('hex')
    .slice(0, bytes * 2);

/** A plausible row: mostly read calls, some of the write path, the odd denial, in a fixed rhythm. */
function body(seq: number, ts: string): AuditBody {
  const agent_id = AGENTS[seq % AGENTS.length]!;
  const base: AuditBody = {
    seq,
    event_id: randomUUID(),
    ts,
    kind: 'tool.call',
    request_id: randomUUID(),
    trace_id: hex(seq, 16),
    agent_id,
    actor: null,
    tool: TOOLS[seq % TOOLS.length]!,
    source: 'local',
    target_type: null,
    target_ref: null,
    approval_request_id: null,
    approval_id: null,
    approvers: null,
    dry_run: false,
    content_sha256: null,
    file_sha256: null,
    result: 'ok',
    error_code: null,
    details: { args_sha256: hex(seq), duration_ms: seq % 17, count: seq % 21 },
  };
  const slot = seq % 20;
  const write = (kind: AuditKind, extra: Partial<AuditBody>): AuditBody => ({
    ...base,
    kind,
    tool: 'send_message',
    target_type: 'contact',
    target_ref: 'ct_david',
    approval_request_id: randomUUID(),
    content_sha256: hex(seq + 1),
    ...extra,
  });
  if (slot === 17) return write('approval.requested', { dry_run: true, details: {} });
  if (slot === 18)
    return write('write.started', { approval_id: randomUUID(), approvers: ['chair-ada'], details: {} });
  if (slot === 19) {
    return write('write.succeeded', {
      approval_id: randomUUID(),
      approvers: ['chair-ada'],
      details: { message_ref: `ms_${seq}`, conversation_id: 'cv_david', sent_at: ts },
    });
  }
  if (slot === 16) {
    return {
      ...base,
      result: 'error',
      error_code: 'INVALID_ARGUMENT',
      details: {
        args_sha256: hex(seq),
        duration_ms: 1,
        reason: 'invalid_argument',
        issues: ['limit: Too big'],
      },
    };
  }
  return base;
}

/** COPY text format: tab-separated, backslash escapes, \N for null. */
function copyField(v: unknown): string {
  if (v === null || v === undefined) return '\\N';
  const text =
    typeof v === 'object' ? JSON.stringify(v) : typeof v === 'boolean' ? (v ? 't' : 'f') : String(v);
  return text.replace(/[\\\t\n\r]/g, (c) =>
    c === '\\' ? '\\\\' : c === '\t' ? '\\t' : c === '\n' ? '\\n' : '\\r',
  );
}

/**
 * Appends `n` chained rows to `audit_events` (after whatever is there: the table must be empty), through
 * COPY: a valid chain, hashed by the real chain code, at a realistic mix of kinds.
 */
export async function generateAuditRows(url: string, n: number, onProgress?: (done: number) => void) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const start = Date.now() - n * 10; // one row every 10 ms, ending now
    async function* chunks() {
      let prev = GENESIS_HASH;
      let lines: string[] = [];
      for (let seq = 1; seq <= n; seq++) {
        const row = body(seq, new Date(start + seq * 10).toISOString());
        const hash = chainHash(prev, row);
        const full = { ...row, prev_hash: prev, hash };
        prev = hash;
        lines.push(EXPORT_COLUMNS.map((c) => copyField(full[c])).join('\t'));
        if (lines.length === 5000 || seq === n) {
          yield `${lines.join('\n')}\n`;
          lines = [];
          onProgress?.(seq);
        }
      }
    }
    await copyIn(client, `copy audit_events (${EXPORT_COLUMNS.join(', ')}) from stdin`, chunks());
  } finally {
    await client.end();
  }
}
