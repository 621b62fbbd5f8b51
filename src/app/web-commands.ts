import { z } from 'zod';
import { describeZodError, runAdminCommand, type AdminDeps } from '../admin/commands.ts';
import { AppError } from '../core/errors.ts';
import type { RunCommand } from '../web/account-kit.ts';

/**
 * The operator commands for the web UI's account pages: the very commands the CLI and the admin endpoint
 * run, and, as there, an input the command's schema refuses is a CONFIG_INVALID refusal naming the field.
 */
export function webCommands(deps: AdminDeps): RunCommand {
  return async (input) => {
    try {
      return await runAdminCommand(deps, input);
    } catch (err) {
      if (err instanceof z.ZodError)
        throw new AppError('CONFIG_INVALID', describeZodError(err), undefined, { cause: err });
      throw err;
    }
  };
}
