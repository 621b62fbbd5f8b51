import { z } from 'zod';
import { isAppError } from '../../src/core/errors.ts';
import { envelopeSchema } from '../../src/tools/index.ts';

/*
 * What tests read src/'s answers with, and src/ itself never needs: the inverse of an escape, the
 * strict form of a successful envelope, the refusal of a bad profile.
 */

/** The text `escapeText` (src/core/safe-text.ts) was given, from what it returned. */
export const unescapeText = (s: string): string =>
  s.replace(/\\(\\|u[0-9a-f]{4})/g, (_m, e: string) =>
    e === '\\' ? '\\' : String.fromCharCode(Number.parseInt(e.slice(1), 16)),
  );

/** The exact shape of a successful result: the envelope with the tool's own fields required. */
export const successSchema = (fields: z.ZodObject) =>
  envelopeSchema(fields).extend({ ...fields.shape, ok: z.literal(true) });

/** Whether `err` is the refusal of a profile that cannot be used (src/core/profiles.ts). */
export const isProfileError = (err: unknown) => isAppError(err, 'CONFIG_INVALID', 'profile');
