import path from 'node:path';
import { InvalidArgumentError } from 'commander';
import { z } from 'zod';
import { ApprovalStatus } from '../core/schemas.ts';
import { AuditKind } from '../core/audit-kinds.ts';
import { loadProfiles } from '../core/profiles.ts';
import { Role } from '../core/identity.ts';

/**
 * Parsers for the command line's option values. Each throws commander's InvalidArgumentError, so the
 * refusal names the option and the value, and comes before any command touches the database.
 */

/** The values an option accepts, for Option.choices: the same lists the commands validate against. */
export const CHOICES = {
  format: ['jsonl', 'csv'],
  result: ['ok', 'error'],
  kind: AuditKind.options,
  status: ApprovalStatus.options,
} as const;

export function positiveInt(value: string): number {
  const n = Number(value);
  if (!/^[0-9]+$/.test(value) || !Number.isSafeInteger(n) || n < 1)
    throw new InvalidArgumentError('expected a positive integer.');
  return n;
}

/**
 * `agent set --rate-limit`: a number, or "default" to clear the agent's own limit. Not null for
 * "default": commander turns a parser's null into an empty string.
 */
export function positiveIntOrDefault(value: string): number | 'default' {
  if (value === 'default') return 'default';
  try {
    return positiveInt(value);
  } catch {
    throw new InvalidArgumentError('expected a positive integer, or "default".');
  }
}

const IsoTime = z.iso.datetime({ offset: true });

/** The same rule as the export filter, so a value accepted here is never refused by the command. */
export function isoTime(value: string): string {
  if (!IsoTime.safeParse(value).success)
    throw new InvalidArgumentError('expected an ISO-8601 time such as 2026-01-31T00:00:00Z.');
  return value;
}

export function roles(value: string): Role[] {
  const list = value.split(',').map((r) => r.trim());
  if (list.some((r) => !Role.safeParse(r).success))
    throw new InvalidArgumentError(`expected ${Role.options.join(', ')}, comma-separated.`);
  return list as Role[];
}

/** A parser accepting only an installed profile; the directory is read when the option is met. */
export function installedProfile(profilesDir: () => string | undefined) {
  return (value: string): string => {
    const installed = [...loadProfiles(profilesDir()).keys()];
    if (!installed.includes(value))
      throw new InvalidArgumentError(`no such profile; installed: ${installed.join(', ')}.`);
    return value;
  };
}

/** The export format from a file name's extension, or undefined when it is neither. */
export function formatOfFile(file: string): 'jsonl' | 'csv' | undefined {
  const ext = path.extname(file).toLowerCase();
  return ext === '.jsonl' ? 'jsonl' : ext === '.csv' ? 'csv' : undefined;
}
