/**
 * The audit log's front door: the only file of audit/ that modules outside it import
 * (.dependency-cruiser.cjs holds every floor to it). The append-only log, its queries, exports,
 * checkpoints, anchors and the counted refusals.
 */
export { describeAnchors } from './anchors/check.ts';
export { verifyDatabaseAnchors } from './anchors/verify-anchors.ts';
export type { AuditInput } from './chain.ts';
export { createAuditChecks, type AuditChecks } from './checks.ts';
export { createCheckpointer, type Checkpointer } from './checkpointer.ts';
export { checkpointIfDue, checkpointTick, type CheckpointDeps } from './checkpoints.ts';
export { checkpointDeps, verifyDatabase } from './context.ts';
export { exportToFile } from './export-file.ts';
export { exportFileOf, openExportFile } from './export-download.ts';
export { createExportRecords, type ExportRecord, type ExportRecords } from './export-records.ts';
export { ExportFilter, isNothingToExport, type Manifest } from './export.ts';
export { createAuditLog, type AuditLog, type GuardedChange } from './log.ts';
export { AuditQuery, headSeq } from './query.ts';
export { createAuditReader, type AuditReader } from './reader.ts';
export { createRefusals, type Refusals } from './refusals.ts';
export { createPace, type Pace } from './pace.ts';
