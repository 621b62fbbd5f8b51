import fs from 'node:fs';
import type { Command } from 'commander';
import type { Config } from '../config.ts';
import { AppError } from '../core/errors.ts';
import { cliActor, config, err, out, usageError } from './io.ts';
import { runData } from './run-data.ts';

/** The approval policy's commands (docs/policy.md): check a file, store it, show and explain it. */

/** A policy file as JSON; a file that cannot be read or parsed is a structured error naming it. */
function readPolicyFile(file: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new AppError('NOT_FOUND', `cannot read ${file}: ${(e as Error).message}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new AppError(
      'CONFIG_INVALID',
      `${file} is not valid JSON: ${(e as Error).message}`,
      'policy_invalid',
    );
  }
}

/**
 * `policy check`'s look at the users: the rules no request could get through as they stand now, as
 * warnings on stderr. Only where there is a database to ask (check never creates one); a database that
 * cannot be asked is said, and the compile check stands.
 */
async function warnUnsatisfiable(cfg: Config, doc: unknown): Promise<void> {
  if (!cfg.database_url && !fs.existsSync(cfg.pglite_dir)) return;
  try {
    const { warnings } = await runData(cfg, { command: 'policy.warnings', policy: doc });
    for (const w of warnings) err(`warning: ${w}`);
  } catch (e) {
    err(`note: the rules were not checked against the users: ${(e as Error).message}`);
  }
}

/** `policy check|set|show|explain` (docs/policy.md). */
export function addPolicyCommands(cli: Command): void {
  const policy = cli
    .command('policy')
    .description('approval rules: who must countersign what (docs/policy.md)');
  policy
    .command('check')
    .argument('<file>', 'a policy file: {"timezone": …, "rules": [{"name", "when", "then"}]}')
    .description('type-check every rule of a policy file, nothing stored; prints its version')
    .action(async (file: string) => {
      const { compilePolicy } = await import('../approval/index.ts');
      const cfg = config();
      const doc = readPolicyFile(file);
      const compiled = compilePolicy(doc, cfg.approval.required_approvers);
      out(`${file}: ${compiled.doc.rules.length} rule(s) compile; version ${compiled.version}`);
      await warnUnsatisfiable(cfg, doc);
    });
  policy
    .command('set')
    .argument('<file>', 'a policy file, as policy check reads it')
    .description('store a policy for every replica on this database (audited as policy.changed)')
    .action(async (file: string) => {
      const doc = readPolicyFile(file);
      const result = await runData(config(), { command: 'policy.set', policy: doc, actor: cliActor() });
      out(
        `policy stored: version ${result.after}${result.changed ? ` (was ${result.before})` : ' (unchanged)'}`,
      );
      for (const w of result.warnings) err(`warning: ${w}`);
    });
  policy
    .command('show')
    .description('the policy in force, where it comes from (database or config) and its version')
    .action(async () => {
      const shown = await runData(config(), { command: 'policy.show' });
      out(`version ${shown.version} (from the ${shown.origin})`);
      out(JSON.stringify(shown.policy, null, 2));
    });
  policy
    .command('explain')
    .requiredOption('--tool <tool>', 'the tool as agents call it, e.g. isphere_send_message')
    .requiredOption('--args <json>', "the call's arguments as a JSON object")
    .option('--agent <name>', 'the calling agent (for agent.name and agent.owner)')
    .option('--file <file>', 'a policy file to explain instead of the policy in force (nothing stored)')
    .description('which rule a call would meet and what it would ask, nothing drafted')
    .action(async (opts: { tool: string; args: string; agent?: string; file?: string }) => {
      let args: unknown;
      try {
        args = JSON.parse(opts.args) as unknown;
      } catch (e) {
        throw usageError(`--args is not valid JSON: ${(e as Error).message}`);
      }
      if (typeof args !== 'object' || args === null || Array.isArray(args))
        throw usageError('--args must be a JSON object');
      const r = await runData(config(), {
        command: 'policy.explain',
        tool: opts.tool,
        args: args as Record<string, unknown>,
        agent: opts.agent,
        ...(opts.file === undefined ? {} : { policy: readPolicyFile(opts.file) }),
      });
      if (opts.file !== undefined) out(`policy   ${opts.file} (not applied)`);
      out(`rule     ${r.rule ?? '(none matches: the default for this tool)'}`);
      out(`asks     ${r.asks}`);
      out(`version  ${r.version}`);
    });
}
