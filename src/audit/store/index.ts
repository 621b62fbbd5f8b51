/**
 * The audit log's stores: every statement on the tables audit/ owns (audit_events, audit_checkpoints,
 * audit_exports, audit_anchors, refusal_counts), and the one read of an agent an export's filter
 * makes. The rule files of audit/ hand these a connection or their transaction; they never build a
 * statement themselves.
 */
export * as events from './events.ts';
export * as chain from './chain.ts';
export * as checkpoints from './checkpoints.ts';
export * as anchors from './anchors.ts';
export * as refusals from './refusals.ts';
export * as exportsMade from './exports.ts';
export * as agents from './agents.ts';
export { AUDIT_LOCK_KEY, type GuardedChange, type RowSigner } from './chain.ts';
