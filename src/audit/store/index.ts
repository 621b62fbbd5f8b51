/**
 * The audit log's stores: statements on the tables audit/ owns (audit_events, audit_exports), and
 * the one read of an agent an export's filter makes. The rule files of audit/ hand these a connection
 * or their transaction; they never build a statement themselves.
 */
export * as events from './events.ts';
export * as exportsMade from './exports.ts';
export * as agents from './agents.ts';
