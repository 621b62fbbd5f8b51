/**
 * The connectors' front door: the only file of connectors/ that modules outside it import
 * (.dependency-cruiser.cjs holds every floor to it). The local store, the bridge, upstream MCP
 * servers and the set that picks one per call.
 */
export { createBridgeConnector } from './bridge/client.ts';
export { createBlobStore, type BlobStore } from './local/blobs.ts';
export { demoData } from './local/demo.ts';
export {
  createDirectoryImport,
  type DirectoryImport,
  directoryIsEmpty,
  fillNameSkeletons,
  importData,
  parseImportFile,
  type ImportSummary,
} from './local/import.ts';
export { directoryLookalikes, findLocalWrite } from './local/send.ts';
export { createLocalConnector } from './local/store.ts';
export { createUpstreamPins, exposedName, pinRowFacts, type PinRow, type UpstreamPins } from './mcp/pins.ts';
export { createPinAdmin, unknownUpstream, type Accepted, type PinAdmin } from './mcp/pin-accept.ts';
export { readPins } from './mcp/pin-store.ts';
export { upstreamValidator } from './mcp/schemas.ts';
export { connectUpstream, errorText, type Upstream, type UpstreamTool } from './mcp/upstream.ts';
export type { Connector, FileRecord, ResolvedTarget, WriteFence } from './types.ts';
export { createConnectorSet, SourcePreference, type ConnectorSet } from './set.ts';
