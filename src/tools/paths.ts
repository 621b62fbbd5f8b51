import fs from 'node:fs';
import path from 'node:path';
import { AppError } from '../core/errors.ts';

/** The real path of `p`, or of its nearest existing ancestor with the rest appended (for paths to create). */
function realpathAllowingMissing(p: string): string {
  const missing: string[] = [];
  let current = p;
  for (;;) {
    try {
      return path.join(fs.realpathSync(current), ...missing.reverse());
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      const parent = path.dirname(current);
      if (parent === current) throw err;
      missing.push(path.basename(current));
      current = parent;
    }
  }
}

function isInside(root: string, candidate: string): boolean {
  const rel = path.relative(root, candidate);
  return rel === '' || (!rel.startsWith('..') && !path.isAbsolute(rel));
}

/**
 * Resolves `requested` (relative to `root`, or absolute) and refuses anything that lands outside `root`
 * once `..` and every symlink are resolved. Returns the real path.
 */
export function resolveInside(root: string, requested: string, param: string): string {
  if (requested.includes('\0'))
    throw new AppError('INVALID_ARGUMENT', `${param} contains a NUL byte`, 'bad_path');
  fs.mkdirSync(root, { recursive: true });
  const realRoot = fs.realpathSync(root);
  let real: string;
  try {
    real = realpathAllowingMissing(path.resolve(realRoot, requested));
  } catch (err) {
    // A path the file system cannot even look at (a name over 255 bytes, a file used as a directory).
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENAMETOOLONG' || code === 'ENOTDIR') {
      throw new AppError('INVALID_ARGUMENT', `${param} is not a usable path (${code})`, 'bad_path');
    }
    throw err;
  }
  if (!isInside(realRoot, real)) {
    throw new AppError(
      'PERMISSION_DENIED',
      `${param} must stay inside the configured directory ${root}`,
      'path_outside_allowed_dir',
    );
  }
  return real;
}

/** A file name that is safe to create in a directory: no separators, control characters or dot-only names. */
export function safeFileName(name: string, fallback: string): string {
  const cleaned = path
    .basename(name.replace(/\\/g, '/'))
    // eslint-disable-next-line no-control-regex -- stripping control characters is the point
    .replace(/[\u0000-\u001f\u007f]/g, '')
    .trim();
  return cleaned === '' || /^\.+$/.test(cleaned) ? fallback : cleaned.slice(0, 200);
}
