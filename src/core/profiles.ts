import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { Facet } from './schemas.ts';
import { AppError } from './errors.ts';
import { ROOT } from './paths.ts';

export const FACETS = Facet.options;

const Profile = z.strictObject({
  name: z.string().regex(/^[a-z0-9][a-z0-9_-]{0,63}$/),
  description: z.string().optional(),
  allow: z.array(z.string()),
  /** Facets whose write tools may only dry-run: a real execution answers DRY_RUN_ONLY. */
  dry_run_only: z.array(z.string()).default([]),
  /** facet → the reason shown to an agent that calls one of its tools. */
  deny: z.record(z.string(), z.string()),
});
export type Profile = z.infer<typeof Profile> & { allowed: ReadonlySet<Facet> };

/** A profile that cannot be used: named by file and field, refused at start-up. */
const profileError = (message: string) => new AppError('CONFIG_INVALID', message, 'profile');

/** Strict: every known facet named exactly once, in allow or in deny, with a non-empty deny reason. */
export function validateProfile(input: unknown, source: string): Profile {
  const parsed = Profile.safeParse(input);
  if (!parsed.success) {
    const i = parsed.error.issues[0]!;
    throw profileError(`${source}: ${i.path.join('.') || 'profile'}: ${i.message}`);
  }
  const p = parsed.data;
  const named = [...p.allow, ...Object.keys(p.deny)];
  for (const facet of named) {
    if (!(FACETS as readonly string[]).includes(facet)) {
      throw profileError(`${source}: unknown facet "${facet}" (known: ${FACETS.join(', ')})`);
    }
  }
  for (const facet of FACETS) {
    const times = named.filter((f) => f === facet).length;
    if (times === 0) throw profileError(`${source}: facet "${facet}" is named neither in allow nor in deny`);
    if (times > 1) {
      const both = p.allow.includes(facet) && facet in p.deny;
      throw profileError(`${source}: facet "${facet}" is named ${both ? 'in both allow and deny' : 'twice'}`);
    }
  }
  for (const [facet, reason] of Object.entries(p.deny)) {
    if (reason.trim() === '') throw profileError(`${source}: deny reason for "${facet}" is empty`);
  }
  for (const facet of p.dry_run_only) {
    if (!p.allow.includes(facet))
      throw profileError(`${source}: dry_run_only facet "${facet}" is not allowed`);
  }
  return { ...p, allowed: new Set(p.allow as Facet[]) };
}

export const PROFILES_DIR = path.join(ROOT, 'profiles');

/** Loads every `*.json` profile of `dir`; any invalid one stops start-up with its problem named. */
export function loadProfiles(dir = PROFILES_DIR): Map<string, Profile> {
  const profiles = new Map<string, Profile>();
  for (const file of fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()) {
    const source = path.join(dir, file);
    let json: unknown;
    try {
      json = JSON.parse(fs.readFileSync(source, 'utf8'));
    } catch (err) {
      throw profileError(`${source}: not valid JSON (${(err as Error).message})`);
    }
    const profile = validateProfile(json, source);
    if (`${profile.name}.json` !== file)
      throw profileError(`${source}: name "${profile.name}" must match the file name`);
    profiles.set(profile.name, profile);
  }
  if (!profiles.has('all')) throw profileError(`${dir}: the profile "all" is missing`);
  return profiles;
}
