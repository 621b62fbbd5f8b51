import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';

/**
 * Every table has one owner: the folder whose stores read and write it (CONTRIBUTING.md, "A new
 * table"). Anywhere else in src/, a query that starts from the table (`knex('users')`, `trx('users as
 * u')`) is a table read behind its owner's back, and fails here with where it is. A join inside an
 * owner's query may name another folder's table (a view that shows an agent's name), and two reads
 * are across owners on purpose (ALLOWED, each with its reason). SQL text is read too: a raw query or
 * subquery naming another folder's table is refused unless RAW_ACROSS_OWNERS lists it with its reason.
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
  'src/audit/store/agents.ts': ['agents'],
};

const SRC = path.resolve(import.meta.dirname, '../../src');
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

/**
 * SQL text in src/ (a raw query, a subquery, a select-list item) that names another folder's table, on
 * purpose: the file, the tables, and why. Each reads inside its owner's own statement, so that a check
 * costs no round trip of its own; anything else that names another owner's table in SQL fails below.
 */
const RAW_ACROSS_OWNERS: Record<string, string[]> = {
  // Whether the log holds a change of a record after the one its seal binds, and an agent's revocation,
  // read with the record (docs/identity.md, "Sealed records are fresh").
  'src/accounts/store/sql.ts': ['audit_events'],
  // The approvers' sealed records, their freshness and whether one is disabled, read with the request
  // at execution; the agent's owner and name with the decision.
  'src/approval/store/sql.ts': ['agents', 'users', 'audit_events'],
  'src/approval/store/guarded.ts': ['agents', 'users'],
  'src/approval/store/outbox.ts': ['agents'],
  // The log's last policy.changed, read with the stored policy (docs/policy.md, "The policy is sealed").
  'src/approval/rules/store.ts': ['audit_events'],
  // An agent's name beside its rows in the audit views.
  'src/audit/store/events.ts': ['agents'],
};

/** A table named after from, join, update or into inside a string or template literal. */
const SQL_TABLE = /\b(?:from|join|update|into)\s+([a-z_]+)\b/gi;

it("reads raw SQL too: another owner's table is named in SQL text only where listed, with its reason", () => {
  const found: string[] = [];
  for (const file of files(SRC)) {
    const rel = path.relative(path.dirname(SRC), file);
    if ((ALLOWED[rel] ?? []).includes('*')) continue;
    const folder = rel.split(path.sep)[1]!;
    const allowed = RAW_ACROSS_OWNERS[rel] ?? [];
    const text = fs.readFileSync(file, 'utf8');
    for (const literal of text.matchAll(/`[^`]*`|'[^'\n]*'/g)) {
      for (const m of literal[0].matchAll(SQL_TABLE)) {
        const table = m[1]!.toLowerCase();
        const owner = OWNERS[table];
        if (!owner || owner === folder || allowed.includes(table)) continue;
        const line = text.slice(0, literal.index + m.index).split('\n').length;
        found.push(`${rel}:${line} ${table} (owned by ${owner}/)`);
      }
    }
  }
  assert.deepEqual(found, []);
});

it('lists no raw read across owners that is not there', () => {
  const stale = Object.entries(RAW_ACROSS_OWNERS).flatMap(([rel, tables]) => {
    const text = fs.readFileSync(path.join(path.dirname(SRC), rel), 'utf8');
    const named = new Set([...text.matchAll(SQL_TABLE)].map((m) => m[1]!.toLowerCase()));
    return tables.filter((t) => !named.has(t)).map((t) => `${rel} ${t}`);
  });
  assert.deepEqual(stale, []);
});

it('knows an owner for every table the migrations create', () => {
  const dir = path.resolve(import.meta.dirname, '../../migrations');
  const created = fs
    .readdirSync(dir)
    .flatMap((f) => [...fs.readFileSync(path.join(dir, f), 'utf8').matchAll(/createTable\('([a-z_]+)'/g)])
    .map((m) => m[1]!);
  assert.deepEqual(
    created.filter((t) => !(t in OWNERS)),
    [],
  );
});

/**
 * Statements are built in store modules only (scripts/store-modules.json, CONTRIBUTING.md "A new
 * table"): a rule file hands a connection or its transaction to a store and never names a table itself.
 */
const STORE_LIST = JSON.parse(
  fs.readFileSync(path.resolve(import.meta.dirname, '../../scripts/store-modules.json'), 'utf8'),
) as { stores: string[] };

/** A glob of the list as a regular expression: `**` any path, `*` any name part. */
const globRegExp = (glob: string) =>
  new RegExp(
    `^${glob
      .replace(/[.+?^${}()|[\]\\]/g, '\\$&')
      .replace(/\*\*\//g, '@DIRS@')
      .replace(/\*\*/g, '.*')
      .replace(/\*/g, '[^/]*')
      .replace(/@DIRS@/g, '(?:.*/)?')}$`,
  );
const isStore = (rel: string) => STORE_LIST.stores.some((g) => globRegExp(g).test(rel));

/** Where a file starts a statement on a table or imports knex: `line what` for each. */
function statementsIn(text: string): string[] {
  const found: string[] = [];
  const lineOf = (index: number) => text.slice(0, index).split('\n').length;
  for (const m of text.matchAll(QUERY_START)) if (m[1] ?? m[2]) found.push(`${lineOf(m.index)} ${m[0]}`);
  for (const m of text.matchAll(/from 'knex'/g)) found.push(`${lineOf(m.index)} imports knex`);
  for (const literal of text.matchAll(/`[^`]*`|'[^'\n]*'/g))
    for (const m of literal[0].matchAll(SQL_TABLE))
      if (m[1]!.toLowerCase() in OWNERS) found.push(`${lineOf(literal.index + m.index)} ${m[0]}`);
  return found;
}

it('builds statements only in store modules and db/', () => {
  const found = files(SRC)
    .map((file) => path.relative(path.dirname(SRC), file).split(path.sep).join('/'))
    .filter((rel) => !isStore(rel))
    .flatMap((rel) =>
      statementsIn(fs.readFileSync(path.join(path.dirname(SRC), rel), 'utf8')).map((s) => `${rel}:${s}`),
    );
  assert.deepEqual(found, []);
});

it('knows a store module by its place', () => {
  assert.equal(isStore('src/approval/store/requests.ts'), true);
  assert.equal(isStore('src/approval/rules/store.ts'), true);
  assert.equal(isStore('src/notify/slack-store.ts'), true);
  assert.equal(isStore('src/db/settings.ts'), true);
  assert.equal(isStore('src/approval/decide.ts'), false);
  assert.equal(isStore('src/approval/storefront.ts'), false);
});
