import fs from 'node:fs';
import os from 'node:os';
import { installedProfile } from '../admin/cli-input.ts';
import { readHiddenLine } from '../admin/secret.ts';
import { loadConfig, type Config } from '../config.ts';
import { AppError, isAppError } from '../core/errors.ts';

/**
 * What every command of the CLI shares: the terminal (the CLI is the only part of the program that
 * writes to it, or reads process.env and argv), the configuration, who acts, passwords and files the
 * command line names, and the refusal of a command line that cannot be right.
 */

export const out = (line: string) => process.stdout.write(`${line}\n`);
export const err = (line: string) => process.stderr.write(`${line}\n`);
/** Who acts, in audit rows of commands run here: the OS user and the host. */
export const cliActor = () => `cli:${os.userInfo().username}@${os.hostname()}`;

/** The reason of a command line that cannot be right whatever the data: exit code 2, like commander's. */
export const USAGE = 'usage';
export const usageError = (message: string) => new AppError('CONFIG_INVALID', message, USAGE);

export function config(): Config {
  return loadConfig(process.env, process.cwd());
}

/** The first line of stdin: typed without echo at a terminal (prompted on stderr), else piped. */
export async function readSecretLine(prompt: string): Promise<string> {
  if (process.stdin.isTTY) {
    process.stderr.write(prompt);
    const line = await readHiddenLine(process.stdin, process.stderr);
    if (!line) throw new AppError('CONFIG_INVALID', 'no password given');
    return line;
  }
  let data = '';
  for await (const chunk of process.stdin) {
    data += String(chunk);
    if (data.includes('\n')) break;
  }
  const line = data.split(/\r?\n/)[0] ?? '';
  if (!line) throw new AppError('CONFIG_INVALID', 'no password given (stdin was empty)');
  return line;
}

/** The password of `--as USER`: COUNTERSIGN_PASSWORD, or the first line of stdin; a refusal names both. */
export const chairPassword = async () => {
  if (process.env.COUNTERSIGN_PASSWORD) return process.env.COUNTERSIGN_PASSWORD;
  try {
    return await readSecretLine('password: ');
  } catch (e) {
    if (!isAppError(e, 'CONFIG_INVALID')) throw e;
    throw new AppError(
      'CONFIG_INVALID',
      `${e.message}: --as USER signs in with a password, from COUNTERSIGN_PASSWORD or the first line of stdin ` +
        '(typed at the prompt when stdin is a terminal)',
      undefined,
      { cause: e },
    );
  }
};

/** Writes to stderr and resolves once the text has been handed to the OS (or fails if it could not be). */
export const errFlushed = (text: string) =>
  new Promise<void>((resolve, reject) => process.stderr.write(text, (e) => (e ? reject(e) : resolve())));

/** Only an installed profile; the profiles directory comes from the configuration. */
export const profile = installedProfile(() => config().policy.profiles_dir);

/** A listed record that does not carry its seal (docs/identity.md, "Sealed records"), marked so. */
export const tampered = (r: { sealed?: boolean }) =>
  r.sealed === false ? '\tTAMPERED (changed outside the server: check it, then reseal it)' : '';

/** A file the operator named, read whole; one that cannot be read is NOT_FOUND, naming it. */
export function readInput(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new AppError('NOT_FOUND', `cannot read ${file}: ${(e as Error).message}`, undefined, { cause: e });
  }
}
