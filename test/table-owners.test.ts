import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';

/**
 * Every table has one owner: the folder whose stores read and write it (CONTRIBUTING.md, "A new
 * table"). Anywhere else in src/, a query that starts from the table (`knex('users')`, `trx('users as
 * u')`) is a table read behind its owner's back, and fails here with where it is. A join inside an
 * owner's query may name another folder's table (a view that shows an agent's name), and two reads
 * are across owners on purpose (ALLOWED, each with its reason).
 */
const OWNERS: Record<string, string> = {
  agents: 'accounts',
  users: 'accounts',
  web_sessions: 'accounts',
  sign_in_attempts: 'accounts',
  rate_windows: 'accounts',
  agent_memory: 'accounts',
  audit_events: 'audit',
  audit_checkpoints: 'audit',
  audit_exports: 'audit',
  audit_anchors: 'audit',
  refusal_counts: 'audit',
  approval_requests: 'approval',
  approval_decisions: 'approval',
  idempotency_keys: 'approval',
  notification_outbox: 'approval',
  approval_tasks: 'approval',
  slack_messages: 'notify',
  slack_callbacks_seen: 'notify',
  contacts: 'connectors',
  groups: 'connectors',
  group_members: 'connectors',
  conversations: 'connectors',
  messages: 'connectors',
  files: 'connectors',
  upstream_tool_pins: 'connectors',
  settings: 'db',
  server_secrets: 'db',
};

/** Reads across owners on purpose: the file, the tables it may read ('*': all), and why. */
const ALLOWED: Record<string, string[]> = {
  // Copies every table, whoever owns it: that is what a move of the database is.
  'src/admin/db-copy.ts': ['*'],
  // audit/ is below accounts/: an export's filter names an agent, and the export refuses a name nobody
  // has in its own read (a signed export of zero rows would read as proof the agent did nothing).
  'src/audit/export-file.ts': ['agents'],
};

const SRC = path.resolve(import.meta.dirname, '../src');
const files = (dir: string): string[] =>
  fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });

/** `knex('users')`, `trx('x as y')`, or a query from a constant that names a table (`trx(PINS)`). */
const QUERY_START = /\b(?:knex|trx|tx|db|q)\(\s*(?:'([a-z_]+)(?: as \w+)?'|([A-Z][A-Z_]*))\s*\)/g;

/** Every `const NAME = 'table'` in src/ whose value is a table: a query may start from the name. */
const constantsNamingTables = (sources: string[]) =>
  new Map(
    sources.flatMap((file) =>
      [...fs.readFileSync(file, 'utf8').matchAll(/\bconst ([A-Z][A-Z_]*) = '([a-z_]+)'/g)]
        .filter((m) => m[2]! in OWNERS)
        .map((m) => [m[1]!, m[2]!] as const),
    ),
  );

it('has every table read and written only by the folder that owns it', () => {
  const found: string[] = [];
  const tableConstants = constantsNamingTables(files(SRC));
  for (const file of files(SRC)) {
    const rel = path.relative(path.dirname(SRC), file);
    const allowed = ALLOWED[rel] ?? [];
    if (allowed.includes('*')) continue;
    const folder = rel.split(path.sep)[1]!;
    const text = fs.readFileSync(file, 'utf8');
    for (const m of text.matchAll(QUERY_START)) {
      const table = m[1] ?? tableConstants.get(m[2]!);
      if (table === undefined) continue;
      const owner = OWNERS[table];
      if (owner && owner !== folder && !allowed.includes(table)) {
        const line = text.slice(0, m.index).split('\n').length;
        found.push(`${rel}:${line} ${table} (owned by ${owner}/)`);
      }
    }
  }
  assert.deepEqual(found, []);
});

it('knows an owner for every table the migrations create', () => {
  const dir = path.resolve(import.meta.dirname, '../migrations');
  const created = fs
    .readdirSync(dir)
    .flatMap((f) => [...fs.readFileSync(path.join(dir, f), 'utf8').matchAll(/createTable\('([a-z_]+)'/g)])
    .map((m) => m[1]!);
  assert.deepEqual(
    created.filter((t) => !(t in OWNERS)),
    [],
  );
});
