import { z } from 'zod';
import { ApprovalSummary, Preflight, Target } from '../../approval/index.ts';
import { SourcePreference } from '../../connectors/index.ts';
import { MessageTargetType } from '../../core/schemas.ts';
import { AppError } from '../../core/errors.ts';
import { countHidden, marked, mixesScripts, scriptsOf } from '../../core/visible.ts';
import type { Config } from '../../config.ts';
import type { Connector, ResolvedTarget } from '../../connectors/index.ts';
import type { WriteResult } from '../types.ts';

/** The inputs every write tool shares: the target, the gate's controls and the source. */
export const writeTargetParams = {
  target_type: MessageTargetType.describe(
    'What target_id names: a contact (one person), a group, or a conversation (an existing chat, direct or group).',
  ),
  target_id: z
    .string()
    .min(1)
    .max(256)
    .describe('The target id; an exact name or account is accepted too if it matches one target.'),
};

export const writeControlParams = {
  approval_id: z
    .string()
    .min(1)
    .max(64)
    .optional()
    .describe(
      'Required when dry_run is false: issued when a chair approves the dry run of exactly this write.',
    ),
  dry_run: z
    .boolean()
    .default(true)
    .describe('Default true: plan the write and request approval; nothing is sent.'),
  idempotency_key: z
    .string()
    .min(1)
    .max(200)
    .optional()
    .describe('Recommended for real writes: the same key with the same content returns the first result.'),
  // The messenger contract lists no local_readonly for writes: a read-only source cannot send.
  source_preference: SourcePreference.exclude(['local_readonly'])
    .default('auto')
    .describe(
      'Which connector sends: auto (default: the one this server is configured with), local (the built-in ' +
        'store), bridge, uia or network. local_readonly is refused (INVALID_ARGUMENT): a read-only source ' +
        'cannot send. A source this server has not configured answers SOURCE_UNAVAILABLE.',
    ),
};

/** Output fields every write tool shares. */
export const writeOutputFields = {
  dry_run: z.boolean(),
  send_status: z.enum(['planned', 'sent', 'rejected']),
  target: Target,
  content_sha256: z
    .string()
    .describe('SHA-256 of the canonical JSON of the exact write; the approval is bound to it.'),
  approval: ApprovalSummary.nullable().describe('On dry run: the approval request to have approved.'),
  preflight: Preflight.nullable().describe(
    'On a dry run given an approval_id (nothing is drafted or consumed): whether a real run with these arguments would be accepted now, or the code and reason it would be refused with.',
  ),
};

/** The output fields every write tool fills the same way from the gate's result (writeOutputFields). */
export function writeOutput(r: WriteResult, target: ResolvedTarget | z.infer<typeof Target>) {
  return {
    dry_run: r.dry_run,
    send_status: r.send_status,
    target,
    content_sha256: r.content_sha256,
    approval: r.approval,
    preflight: r.preflight ?? null,
  };
}

/** Where the messenger put a message once sent (send_message, send_file), else null. */
export const messageRefOf = (r: WriteResult) => (r.result?.message_ref as string | undefined) ?? null;

/**
 * Names, ids and paths are never shown with characters a person cannot see or that reorder what they
 * see (docs/design.md, "Visible characters"): such a value is refused before anything is looked up.
 */
export function refuseHidden(field: string, value: string | null): void {
  const count = value === null ? 0 : countHidden(value);
  if (count === 0) return;
  throw new AppError(
    'INVALID_ARGUMENT',
    `${field} holds ${count} invisible or reordering character${count === 1 ? '' : 's'}: ${marked(value!)}`,
    'invisible_characters',
    { details: { field, count } },
  );
}

/** The resolved target's id and name, checked as the agent's own target_id was. */
export function refuseHiddenTarget(target: ResolvedTarget): void {
  refuseHidden('target_id', target.target_id);
  refuseHidden('target display name', target.display_name);
}

/** Message text and captions: flagged on every review by default, refused with the setting. */
export function refuseHiddenText(field: string, value: string | null, config: Config): void {
  if (config.approval.refuse_invisible_characters) refuseHidden(field, value);
}

/** What the review warns of about a target's name: directory entries that look the same, mixed scripts. */
export interface TargetFlags {
  looks_like: { target_id: string; display_name: string }[];
  scripts: string[];
}

/**
 * Resolves a write's target and checks it: ids and names with hidden characters are refused; a name
 * that looks like another entry of the directory or mixes scripts comes back with its flags, for the
 * review (`review.target_flags`). The flags are not part of the target the tool returns or hashes.
 */
export async function resolveWriteTarget(
  connector: Connector,
  type: MessageTargetType,
  ref: string,
): Promise<{
  target: ResolvedTarget;
  review: { target_flags?: TargetFlags };
  target_facts: { member_count?: number; external?: boolean };
}> {
  refuseHidden('target_id', ref);
  const { lookalikes, member_count, external, ...target } = await connector.resolveTarget(type, ref);
  refuseHiddenTarget(target);
  // What approval rules read of the target besides its name; not part of what the tool returns or hashes.
  const target_facts = { member_count, external };
  const name = target.display_name ?? '';
  const scripts = mixesScripts(name) ? scriptsOf(name) : [];
  if (!lookalikes?.length && scripts.length === 0) return { target, review: {}, target_facts };
  return { target, review: { target_flags: { looks_like: lookalikes ?? [], scripts } }, target_facts };
}
