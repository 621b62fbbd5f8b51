import type { Knex } from 'knex';

/**
 * Composite types the export writes each JSONL line with (docs/audit.md, "Exports and manifests"): for a
 * value of one of them, `row_to_json` writes `{"field":value,…}` with the fields in the type's order,
 * compact, strings escaped as JSON.stringify escapes them — the line's scalar fields in JCS key order,
 * in one function call per part instead of one `to_json` per field (about a third of the database's
 * time per exported row). The fields between the parts (approvers, details) are jsonb, whose text is
 * not canonical; the exporter writes those. src/audit/export-pages.ts holds these lists to the row's.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(
    'create type audit_export_head as (actor text, agent_id text, approval_id text, approval_request_id text)',
  );
  await knex.raw('create type audit_export_middle as (content_sha256 text)');
  await knex.raw(`
    create type audit_export_tail as (
      dry_run boolean, error_code text, event_id uuid, file_sha256 text, kind text, request_id text,
      result text, seq bigint, source text, target_ref text, target_type text, tool text, trace_id text,
      ts text, prev_hash text, hash text
    )`);
}

export async function down(knex: Knex): Promise<void> {
  for (const type of ['audit_export_tail', 'audit_export_middle', 'audit_export_head'])
    await knex.raw(`drop type ${type}`);
}
