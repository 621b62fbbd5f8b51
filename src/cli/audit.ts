import { createPrivateKey, createPublicKey } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { CHOICES, formatOfFile, isoTime } from '../admin/cli-input.ts';
import type { AdminCommand } from '../admin/commands.ts';
import type { Manifest } from '../audit/index.ts';
import { AppError } from '../core/errors.ts';
import { cliActor, config, err, out, readInput, usageError } from './io.ts';
import { runData } from './run-data.ts';

/** The audit log's commands (docs/audit.md): export with a signed manifest, verify, keys, restores. */

type ExportOptions = Record<
  'since' | 'until' | 'agent' | 'tool' | 'kind' | 'result' | 'target' | 'approval',
  string | undefined
> & {
  format?: 'jsonl' | 'csv';
  output?: string;
  force?: boolean;
};

/**
 * The export's format and file: the format from --format or else from the extension of -o FILE, the two
 * never contradicting, and FILE (or its manifest) never overwritten without --force.
 */
function exportTarget(opts: ExportOptions): { format: 'jsonl' | 'csv'; file: string } {
  const fromName = opts.output === undefined ? undefined : formatOfFile(opts.output);
  if (opts.output !== undefined && !fromName && !opts.format)
    throw usageError(
      `option '-o, --output <file>': ${opts.output} must end in .jsonl or .csv, or give --format`,
    );
  if (opts.format && fromName && opts.format !== fromName)
    throw usageError(`option '--format ${opts.format}' contradicts -o ${opts.output} (.${fromName})`);
  const format = opts.format ?? fromName;
  if (!format) throw usageError(`option '--format <format>' (jsonl or csv) is required without -o FILE`);
  const file = path.resolve(
    opts.output ?? `audit-${new Date().toISOString().replace(/[:.]/g, '-')}.${format}`,
  );
  for (const existing of [file, `${file}.manifest.json`].filter((f) => fs.existsSync(f))) {
    if (!opts.force)
      throw usageError(`option '-o, --output <file>': ${existing} exists; give --force to overwrite it`);
  }
  return { format, file };
}

/** `audit export|verify|accept-restore|key`. */
export function addAuditCommands(cli: Command): void {
  const audit = cli.command('audit').description('export and verify the audit log');
  audit
    .command('export')
    .addOption(
      new Option('--format <format>', 'default: from the extension of -o FILE').choices(CHOICES.format),
    )
    .option('--since <time>', 'ISO-8601: rows at or after', isoTime)
    .option('--until <time>', 'ISO-8601: rows before', isoTime)
    .option('--agent <name>', 'only rows of this agent')
    .option('--tool <tool>', 'only rows of this tool')
    .addOption(new Option('--kind <kind>', 'only rows of this kind').choices(CHOICES.kind))
    .addOption(new Option('--result <result>', 'only ok or error rows').choices(CHOICES.result))
    .option('--target <ref>', 'only rows about this target (contact, group, conversation or tool id)')
    .option('--approval <id>', 'only rows of this approval (approval_request_id or approval_id)')
    .option(
      '-o, --output <file>',
      'where to write (default audit-<time>.<format>); the manifest goes beside it',
    )
    .option('--force', 'overwrite FILE and its manifest if they exist')
    .description('export the log with a signed manifest (FILE.manifest.json)')
    .action(exportAudit);
  audit
    .command('verify')
    .argument('[file]', 'an export (JSONL or CSV)')
    .option('--manifest <file>', 'its manifest (default FILE.manifest.json)')
    .option(
      '--pubkey <file>',
      'a public key (PEM) to trust: it must have signed the export and the checkpoints (again for each ' +
        'earlier key, after a rotation)',
      (file: string, files: string[] = []) => [...files, file],
    )
    .option(
      '--fingerprint <hex>',
      "a key to trust by its SHA-256 fingerprint (64 hex digits; 'countersign audit key --fingerprint' " +
        "prints the server's); may be repeated",
      (hex: string, all: string[] = []) => [...all, hex],
    )
    .option(
      '--trust <file>',
      'a trust file: the public keys (PEM) and fingerprints (one a line, # comments) to trust',
    )
    .option(
      '--accept-unpinned-key',
      'exit 0 on an intact export even though no key was pinned (proves integrity, not origin)',
    )
    .option('--db', 'verify the live table instead of an export')
    .option(
      '--require-anchored',
      'fail when rows follow the last checkpoint recorded in the chain (an export needs a pinned key)',
    )
    .option(
      '--tsa-cert <file>',
      "check the time-stamp anchors against this TSA certificate or its CA's (PEM)",
    )
    .option(
      '--tsa-max-skew <seconds>',
      "how far a token's genTime may lie from its checkpoint's time (default audit.anchors.tsa_max_skew_s)",
    )
    .option('--witness <dir>', 'check the chain against the heads of this witness directory')
    .option('--anchors <file>', "the export's anchors (default FILE.anchors.jsonl)")
    .description(
      'verify an export offline against the keys you pin, or the live table; exit 0 only when ' +
        'everything is valid (offline: and signed by a pinned key, unless --accept-unpinned-key)',
    )
    .action(verifyAudit);
  audit
    .command('accept-restore')
    .requiredOption('--reason <text>', 'why the log goes back to the restored head (kept in the audit row)')
    .description(
      'accept a database restored from a backup: give up the newer signed heads it no longer holds, ' +
        'audited; restart the replicas after it',
    )
    .action(acceptRestoreCommand);
  audit
    .command('key')
    .option('--fingerprint', 'print only its SHA-256 fingerprint')
    .description("print the public half of this host's audit signing key (PEM), to pin when verifying")
    .action(printAuditKey);
}

/** `audit export`: the filter as given (empty options left out), written where exportTarget says. */
async function exportAudit(opts: ExportOptions): Promise<void> {
  const { format, file } = exportTarget(opts);
  const filter = Object.fromEntries(
    (['since', 'until', 'tool', 'kind', 'result', 'approval'] as const)
      .filter((k) => opts[k])
      .map((k) => [k, opts[k]]),
  ) as Extract<AdminCommand, { command: 'audit.export' }>['filter'];
  if (opts.target) filter.target_ref = opts.target;
  const result = await runData(config(), {
    command: 'audit.export',
    format,
    filter,
    agent: opts.agent,
    path: file,
    actor: `cli:${os.userInfo().username}`,
  });
  out(`exported ${result.row_count} rows to ${result.path}`);
  out(`manifest: ${result.manifest_path} (checkpoint at seq ${result.checkpoint_seq})`);
}

/** `audit accept-restore`: the heads given up and the row that says so. */
async function acceptRestoreCommand(opts: { reason: string }): Promise<void> {
  const result = await runData(config(), {
    command: 'audit.accept_restore',
    reason: opts.reason,
    actor: cliActor(),
  });
  for (const h of result.given_up)
    out(`gave up the ${h.source.replace('_', ' ')} at seq ${h.seq} (${h.head_hash})`);
  out(`restored head: seq ${result.restored_head?.seq ?? 0}; accepted in audit row ${result.seq}`);
  out('restart every replica: each checks the chain from that row on');
}

interface VerifyOptions {
  manifest?: string;
  pubkey?: string[];
  fingerprint?: string[];
  trust?: string;
  acceptUnpinnedKey?: boolean;
  db?: boolean;
  requireAnchored?: boolean;
  tsaCert?: string;
  tsaMaxSkew?: string;
  witness?: string;
  anchors?: string;
}

/** The keys pinned by --pubkey, --fingerprint and --trust; each refused, naming it, unless it reads as one. */
async function pinsOf(opts: VerifyOptions) {
  const { parseFingerprint, parsePublicKey, parseTrustFile } = await import('../audit/pins.ts');
  const trusted = opts.trust === undefined ? undefined : parseTrustFile(readInput(opts.trust), opts.trust);
  return {
    pems: [...(opts.pubkey ?? []).map((f) => parsePublicKey(readInput(f), f)), ...(trusted?.pems ?? [])],
    fingerprints: [
      ...(opts.fingerprint ?? []).map((hex) => parseFingerprint(hex, '--fingerprint')),
      ...(trusted?.fingerprints ?? []),
    ],
  };
}

/** `audit verify`: an export offline against its manifest, or with --db the live table. */
async function verifyAudit(file: string | undefined, opts: VerifyOptions): Promise<void> {
  const pins = await pinsOf(opts);
  const tsaCertPem = opts.tsaCert === undefined ? undefined : readInput(opts.tsaCert);
  const witnessDir = opts.witness === undefined ? undefined : path.resolve(opts.witness);
  if (opts.db) {
    if (pins.fingerprints.length > 0)
      throw usageError(
        'audit verify --db: pin keys with --pubkey (or PEM keys in --trust), not fingerprints',
      );
    const result = await runData(config(), {
      command: 'audit.verify_db',
      ...(pins.pems.length > 0 ? { pubkeys: pins.pems } : {}),
      ...(tsaCertPem ? { tsa_cert: tsaCertPem } : {}),
      ...(witnessDir ? { witness_dir: witnessDir } : {}),
    });
    out(result.summary);
    if (!result.ok || (opts.requireAnchored && result.tail)) process.exitCode = 1;
    // Anchored means signed by a key the database cannot swap: one given, or the host's own key file.
    if (opts.requireAnchored && result.key_source !== 'given' && result.key_source !== 'host') {
      err(
        'audit verify --db --require-anchored: no pinned key (give --pubkey, or run on the host with its ' +
          'data directory); the key the database records proves nothing about who anchored it',
      );
      process.exitCode = 1;
    }
    return;
  }
  if (!file) throw usageError('audit verify: give an export file, or --db');
  const isPinned = pins.pems.length + pins.fingerprints.length > 0;
  if (opts.requireAnchored && !isPinned)
    throw usageError(
      'audit verify --require-anchored: pin the signing key (--pubkey, --fingerprint or --trust); ' +
        "a manifest's own key proves nothing about who anchored it",
    );
  const manifest = readManifest(file, opts.manifest);
  const [{ describeReport, verifyExport }, { describeOrigin, trustedKeys }] = await Promise.all([
    import('../audit/verify-export.ts'),
    import('../audit/pins.ts'),
  ]);
  const keys = trustedKeys(pins, manifest);
  const report = await verifyExport(file, manifest, keys.length > 0 ? keys : undefined);
  out(describeReport(report));
  const origin = describeOrigin(pins, manifest);
  out(origin.text);
  if (!report.ok || (opts.requireAnchored && report.tail)) process.exitCode = 1;
  if (!origin.ok && (isPinned || !opts.acceptUnpinnedKey)) process.exitCode = 1;
  if (tsaCertPem === undefined && witnessDir === undefined) return;
  const [{ verifyExportAnchors }, { describeAnchors }] = await Promise.all([
    import('../audit/anchors/verify-anchors.ts'),
    import('../audit/anchors/check.ts'),
  ]);
  const anchors = await verifyExportAnchors(file, manifest, {
    tsaCertPem,
    witnessDir,
    anchorsFile: opts.anchors,
    tsaMaxSkewS: maxSkewOf(opts.tsaMaxSkew),
  });
  out(describeAnchors(anchors));
  if (!anchors.ok) process.exitCode = 1;
}

/** --tsa-max-skew as seconds, else the configured bound (defaults apply without a config file). */
function maxSkewOf(given: string | undefined): number {
  if (given === undefined) return config().audit.anchors.tsa_max_skew_s;
  const seconds = Number(given);
  if (!Number.isSafeInteger(seconds) || seconds <= 0)
    throw usageError(`option '--tsa-max-skew <seconds>': "${given}" is not a positive whole number`);
  return seconds;
}

/** The export's manifest (beside it unless named), and the export readable; else NOT_FOUND, saying where to look. */
function readManifest(file: string, named: string | undefined): Manifest {
  const manifestPath = named ?? `${file}.manifest.json`;
  try {
    const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8')) as Manifest;
    fs.accessSync(file, fs.constants.R_OK);
    return manifest;
  } catch (e) {
    const missing = (e as NodeJS.ErrnoException).path;
    // The manifest is looked for beside the export unless named: say so when that is what is missing.
    const hint =
      missing === manifestPath && named === undefined
        ? `; an export's manifest is written beside it as FILE.manifest.json: give another with --manifest FILE`
        : '';
    throw new AppError(
      'NOT_FOUND',
      `cannot read ${missing ?? manifestPath}: ${(e as Error).message}${hint}`,
      undefined,
      { cause: e },
    );
  }
}

/** `audit key`: the public half of the configured signing key, read (never created) from the host. */
async function printAuditKey(opts: { fingerprint?: boolean }): Promise<void> {
  const cfg = config();
  const file = cfg.audit.signing_key_path ?? path.join(cfg.data_dir, 'audit-signing-key.pem');
  let pem: string;
  try {
    pem = createPublicKey(createPrivateKey(fs.readFileSync(file)))
      .export({ format: 'pem', type: 'spki' })
      .toString();
  } catch (e) {
    throw new AppError(
      'NOT_FOUND',
      `cannot read the audit signing key ${file}: ${(e as Error).message}`,
      undefined,
      {
        cause: e,
      },
    );
  }
  const { fingerprintOf } = await import('../audit/pins.ts');
  out(opts.fingerprint ? `sha256:${fingerprintOf(pem)}` : pem.trimEnd());
}
