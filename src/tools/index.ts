/**
 * The tools' front door: the only file of tools/ that modules outside it import
 * (.dependency-cruiser.cjs). Every built-in tool, the definitions' types, the envelope, the cursors,
 * the memory tools' store and the upstream tools' definitions.
 */
import { getApproval } from './read/get-approval.ts';
import { listApprovals } from './read/list-approvals.ts';
import { receiveFiles } from './read/receive-files.ts';
import { receiveMessages } from './read/receive-messages.ts';
import { recall } from './memory/recall.ts';
import { remember } from './memory/remember.ts';
import { searchContacts } from './read/search-contacts.ts';
import { searchGroups } from './read/search-groups.ts';
import type { AnyToolDef } from './types.ts';
import { sendFile } from './write/send-file.ts';
import { sendMessage } from './write/send-message.ts';

/** Every built-in tool, in the order tools/list shows them. */
export const builtinTools: readonly AnyToolDef[] = [
  searchContacts,
  searchGroups,
  receiveMessages,
  receiveFiles,
  sendMessage,
  sendFile,
  getApproval,
  listApprovals,
  remember,
  recall,
];

export { createCursorCodec, type CursorCodec } from './cursor.ts';
export { envelopeSchema, toCallResult, type Settled } from './envelope.ts';
export type { MemoryStore } from './memory/store.ts';
export type { AnyToolDef, ToolOutcome } from './types.ts';
export { upstreamToolDefs } from './upstream.ts';
