import { createHmac, hkdfSync, randomBytes, timingSafeEqual } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { AppError } from './errors.ts';

/**
 * The host roots: what grants authority or names the log, kept on the host, never in the database
 * alone (docs/audit.md, "Host roots"). One JSON file (mode 0600) every replica shares: a random master
 * key, from which each purpose's key is derived (HKDF-SHA256, the purpose as its info), and the audit
 * log's pinned origin. A database administrator without a shell on the host can read and change every
 * table, but cannot make a MAC under these keys nor rename the log.
 */
const HostRootsFile = z.strictObject({
  version: z.literal(1),
  master_key: z.string().regex(/^[A-Za-z0-9_-]{43}$/, 'must be 32 bytes, base64url'),
  audit_origin: z.string().min(1),
  created_at: z.string(),
  /**
   * What the first start after the upgrade took over from the database, once: the origin (so that the
   * existing log keeps its identity), the agent token tag key (tokens already issued keep their tag)
   * and the SHA-256 of every agent token then stored (accepted once each, then stored as a MAC).
   */
  adopted: z
    .strictObject({
      at: z.string(),
      origin: z.boolean(),
      agent_token_tag_key: z.string().optional(),
      agent_token_hashes: z.array(z.string()).default([]),
    })
    .optional(),
  /**
   * The SHA-256 of every active agent's token when agent tokens became MACs (written once, by the
   * first start that found it missing): a stored SHA-256 is accepted only if it is one of these.
   */
  agent_tokens: z
    .strictObject({ at: z.string(), sha256: z.array(z.string()), tag_key: z.string().optional() })
    .optional(),
  /**
   * The seq from which every audit row must carry its row MAC (docs/audit.md, "Row MACs"): the head
   * after the last row appended before MACs, pinned once by the first start that appends them, so that
   * stripping the MACs of newer rows is not taken for an older log. Files without it are read as before.
   */
  row_macs_from: z.strictObject({ seq: z.number().int().positive(), at: z.string() }).optional(),
  /**
   * When the users' and agents' records were sealed (docs/identity.md, "Sealed records"): written once,
   * by the first start (or `countersign migrate`) after the upgrade, after it sealed every record that
   * had no seal. From then on a record without its seal is TAMPERED, never sealed again by a start.
   */
  records_sealed: z.strictObject({ at: z.string() }).optional(),
  /**
   * When the stored approval policy was sealed (docs/policy.md, "The policy is sealed"): written once, by
   * the first start (or `countersign migrate`) after the upgrade, after it sealed a stored policy that had
   * no seal. From then on a stored policy without its seal is TAMPERED, never sealed again by a start.
   */
  policy_sealed: z.strictObject({ at: z.string() }).optional(),
  /**
   * When the records' seals were made to bind the seq of their change (docs/identity.md, "Sealed records
   * are fresh"): written once, by the first start after that upgrade, after it sealed again every record
   * sealed before. From then on only a seal that binds its change's seq verifies.
   */
  records_fresh: z.strictObject({ at: z.string() }).optional(),
  /** The same for the stored approval policy's seal (docs/policy.md, "The policy is sealed"). */
  policy_fresh: z.strictObject({ at: z.string() }).optional(),
});
export type HostRootsFile = z.infer<typeof HostRootsFile>;

/** What keys are derived for; each purpose's key is independent of the others. */
export type KeyPurpose =
  | 'decision'
  | 'session'
  | 'agent-token'
  | 'link'
  | 'cursor'
  | 'sign-in-attempt'
  | 'token-tag'
  | 'row'
  | 'authority'
  | 'policy';

export interface HostRoots {
  file: string;
  origin: string;
  /** The key for one purpose, derived from the master key. */
  key(purpose: KeyPurpose): Buffer;
  /** HMAC-SHA256 of `text` under the purpose's key, hex. */
  mac(purpose: KeyPurpose, text: string): string;
  /** Whether `mac` is `text`'s MAC under the purpose's key (in constant time). */
  verify(purpose: KeyPurpose, text: string, mac: string | null | undefined): boolean;
  /** Token tag keys taken over from the database (tokens issued under them keep their tag). */
  legacyTokenTagKeys: readonly Buffer[];
  /** SHA-256 hashes of agent tokens stored before bearer secrets were MACs (pinned at the upgrade). */
  legacyTokenHashes: ReadonlySet<string>;
  /** Whether the file records which agent tokens were stored as a plain SHA-256 (`agent_tokens`). */
  tokensRecorded: boolean;
  /** The seq from which every audit row carries its row MAC; undefined until pinned (pinRowMacs). */
  rowMacsFrom?: number;
  /** Whether the users' and agents' records were sealed at the upgrade (`records_sealed`). */
  recordsSealed: boolean;
  /** Whether the stored approval policy was sealed at the upgrade (`policy_sealed`). */
  policySealed: boolean;
  /** Whether the records' seals bind their change's seq (`records_fresh`). */
  recordsFresh: boolean;
  /** Whether the stored approval policy's seal binds its change's seq (`policy_fresh`). */
  policyFresh: boolean;
}

const refuseFile = (file: string, why: string) =>
  new AppError(
    'CONFIG_INVALID',
    `secrets.host_roots_path: ${file} ${why} (env COUNTERSIGN_HOST_ROOTS)`,
    'host_roots_invalid',
  );

/** The file's roots; undefined when there is no file yet. A file that is not host roots stops start-up. */
export function readHostRoots(file: string): HostRoots | undefined {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw refuseFile(file, `cannot be read (${(err as Error).message})`);
  }
  let parsed: HostRootsFile;
  try {
    parsed = HostRootsFile.parse(JSON.parse(text));
  } catch (err) {
    throw refuseFile(file, `is not a host roots file (${(err as Error).message.slice(0, 200)})`);
  }
  return rootsOf(file, parsed);
}

function rootsOf(file: string, parsed: HostRootsFile): HostRoots {
  const master = Buffer.from(parsed.master_key, 'base64url');
  const keys = new Map<KeyPurpose, Buffer>();
  const key = (purpose: KeyPurpose) => {
    let k = keys.get(purpose);
    if (!k) {
      k = Buffer.from(hkdfSync('sha256', master, Buffer.alloc(0), `countersign/${purpose}`, 32));
      keys.set(purpose, k);
    }
    return k;
  };
  const mac = (purpose: KeyPurpose, text: string) =>
    createHmac('sha256', key(purpose)).update(text).digest('hex');
  const tagKeys = [parsed.adopted?.agent_token_tag_key, parsed.agent_tokens?.tag_key].filter(
    (k): k is string => k !== undefined,
  );
  return {
    file,
    origin: parsed.audit_origin,
    key,
    mac,
    verify(purpose, text, given) {
      if (typeof given !== 'string' || !/^[0-9a-f]{64}$/.test(given)) return false;
      return timingSafeEqual(Buffer.from(mac(purpose, text), 'hex'), Buffer.from(given, 'hex'));
    },
    legacyTokenTagKeys: [...new Set(tagKeys)].map((k) => Buffer.from(k, 'base64url')),
    legacyTokenHashes: new Set([
      ...(parsed.adopted?.agent_token_hashes ?? []),
      ...(parsed.agent_tokens?.sha256 ?? []),
    ]),
    tokensRecorded: parsed.agent_tokens !== undefined,
    ...(parsed.row_macs_from ? { rowMacsFrom: parsed.row_macs_from.seq } : {}),
    recordsSealed: parsed.records_sealed !== undefined,
    policySealed: parsed.policy_sealed !== undefined,
    recordsFresh: parsed.records_fresh !== undefined,
    policyFresh: parsed.policy_fresh !== undefined,
  };
}

/**
 * Pins `seq` as the first row that must carry a row MAC, unless the file already pins one (that pin
 * stays: it is written once). The file is rewritten aside and renamed into place, its other fields as
 * they were. Returns the roots as the file now has them.
 */
export function pinRowMacs(file: string, seq: number): HostRoots {
  const text = fs.readFileSync(file, 'utf8');
  const parsed = HostRootsFile.parse(JSON.parse(text));
  if (parsed.row_macs_from) return rootsOf(file, parsed);
  return rewrite(file, { ...parsed, row_macs_from: { seq, at: new Date().toISOString() } });
}

/**
 * Records, once, that the users' and agents' records are sealed (`records_sealed`); the file is
 * rewritten aside and renamed into place as by pinRowMacs. Returns the roots as the file now has them.
 */
export function markRecordsSealed(file: string): HostRoots {
  const parsed = HostRootsFile.parse(JSON.parse(fs.readFileSync(file, 'utf8')));
  if (parsed.records_sealed && parsed.records_fresh) return rootsOf(file, parsed);
  const at = { at: new Date().toISOString() };
  return rewrite(file, {
    ...parsed,
    records_sealed: parsed.records_sealed ?? at,
    records_fresh: parsed.records_fresh ?? at,
  });
}

/** Records, once, that the stored approval policy is sealed (`policy_sealed`), as markRecordsSealed. */
export function markPolicySealed(file: string): HostRoots {
  const parsed = HostRootsFile.parse(JSON.parse(fs.readFileSync(file, 'utf8')));
  if (parsed.policy_sealed && parsed.policy_fresh) return rootsOf(file, parsed);
  const at = { at: new Date().toISOString() };
  return rewrite(file, {
    ...parsed,
    policy_sealed: parsed.policy_sealed ?? at,
    policy_fresh: parsed.policy_fresh ?? at,
  });
}

function rewrite(file: string, content: HostRootsFile): HostRoots {
  const aside = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  fs.writeFileSync(aside, `${JSON.stringify(content, null, 2)}\n`, { mode: 0o600, flag: 'wx' });
  try {
    fs.renameSync(aside, file);
  } finally {
    fs.rmSync(aside, { force: true });
  }
  return readHostRoots(file)!;
}

/** What a first start takes over from a database that an earlier version already used. */
export interface Adoption {
  origin?: string;
  agent_token_tag_key?: string;
  /** Absent: this process cannot list them, and leaves the record to the next start that can. */
  agent_token_hashes?: string[];
}

/**
 * Creates the host roots file, unless another process (a replica starting at the same moment) made it
 * first: the file is written aside and linked into place, so it appears whole or not at all, and the
 * loser reads the winner's. Returns the roots in the file and whether this call made them.
 */
export function createHostRoots(
  file: string,
  newOrigin: () => string,
  adoption: Adoption,
): { roots: HostRoots; created: boolean } {
  const content: HostRootsFile = {
    version: 1,
    master_key: randomBytes(32).toString('base64url'),
    audit_origin: adoption.origin ?? newOrigin(),
    created_at: new Date().toISOString(),
    ...(adoption.agent_token_hashes
      ? { agent_tokens: { at: new Date().toISOString(), sha256: adoption.agent_token_hashes } }
      : {}),
  };
  if (adoption.origin !== undefined || adoption.agent_token_tag_key !== undefined) {
    content.adopted = {
      at: content.created_at,
      origin: adoption.origin !== undefined,
      ...(adoption.agent_token_tag_key ? { agent_token_tag_key: adoption.agent_token_tag_key } : {}),
      agent_token_hashes: [],
    };
  }
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const aside = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  fs.writeFileSync(aside, `${JSON.stringify(content, null, 2)}\n`, { mode: 0o600, flag: 'wx' });
  try {
    fs.linkSync(aside, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    return { roots: readHostRoots(file)!, created: false };
  } finally {
    fs.rmSync(aside, { force: true });
  }
  return { roots: rootsOf(file, content), created: true };
}

/**
 * Adds `agent_tokens` to a roots file made before agent tokens were MACs, once: the file is rewritten
 * aside and renamed into place (a replica doing the same at the same moment writes the same set).
 */
export function recordLegacyTokens(roots: HostRoots, hashes: string[], tagKey?: string): HostRoots {
  const text = fs.readFileSync(roots.file, 'utf8');
  const parsed = HostRootsFile.parse(JSON.parse(text));
  if (parsed.agent_tokens) return rootsOf(roots.file, parsed);
  parsed.agent_tokens = {
    at: new Date().toISOString(),
    sha256: hashes,
    ...(tagKey ? { tag_key: tagKey } : {}),
  };
  const aside = `${roots.file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  fs.writeFileSync(aside, `${JSON.stringify(parsed, null, 2)}\n`, { mode: 0o600, flag: 'wx' });
  try {
    fs.renameSync(aside, roots.file);
  } finally {
    fs.rmSync(aside, { force: true });
  }
  return rootsOf(roots.file, parsed);
}
