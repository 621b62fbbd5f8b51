/**
 * Text that cannot be stored or hashed as given: a NUL (no PostgreSQL text or jsonb holds one) or a lone
 * UTF-16 surrogate (no UTF-8 encodes one, and RFC 8785 refuses it). An agent may send either, in any
 * argument, key or tool name; what it sent is then recorded through a reversible escape (docs/audit.md
 * "Input that cannot be stored"): `\` becomes `\\`, a NUL `\u0000`, a lone surrogate `\uXXXX` (lowercase
 * hex), and nothing else changes.
 */

export type UnsafeText = 'nul_byte' | 'lone_surrogate';

const UNSAFE = /\0|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const UNSAFE_ALL = new RegExp(`\\\\|${UNSAFE.source}`, 'g');

// ES2024's String.prototype.isWellFormed (Node 20 has it; this project's lib is ES2023).
declare global {
  interface String {
    isWellFormed(): boolean;
  }
}

/** Whether `s` can be stored and hashed as it is: the cheap test every argument of every call takes. */
const storable = (s: string) => !s.includes('\0') && s.isWellFormed();

/** What makes `s` unstorable and where (the first such code unit), or undefined when it is safe. */
export function unsafeText(s: string): { problem: UnsafeText; at: number } | undefined {
  if (storable(s)) return undefined;
  const m = UNSAFE.exec(s);
  if (!m) return undefined;
  return { problem: m[0] === '\0' ? 'nul_byte' : 'lone_surrogate', at: m.index };
}

/** The reversible escape of `s`: always safe to store and hash. */
export const escapeText = (s: string): string =>
  !s.includes('\\') && storable(s)
    ? s
    : s.replace(UNSAFE_ALL, (c) =>
        c === '\\' ? '\\\\' : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
      );

/** `value` with every string and key escaped (objects and arrays copied; other values as they are). */
export function escapeDeep(value: unknown): unknown {
  if (typeof value === 'string') return escapeText(value);
  if (Array.isArray(value)) return value.map(escapeDeep);
  if (value && typeof value === 'object')
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [escapeText(k), escapeDeep(v)]));
  return value;
}

/** The first `max` UTF-16 code units of `s`, one fewer when the cut would split a surrogate pair. */
export function cutText(s: string, max: number): string {
  if (s.length <= max) return s;
  const last = s.charCodeAt(max - 1);
  const next = s.charCodeAt(max);
  const splits = last >= 0xd800 && last <= 0xdbff && next >= 0xdc00 && next <= 0xdfff;
  return s.slice(0, splits ? max - 1 : max);
}

/** Where in `value` (a dotted path under `root`) the first unsafe string or key is, and what it holds. */
export interface UnsafeInput {
  field: string;
  problem: UnsafeText;
  /** The offending string or key itself. */
  text: string;
  at: number;
}

/** The first string or key of `value` that cannot be stored; iterative, in document order. */
export function findUnsafeText(value: unknown, root: string): UnsafeInput | undefined {
  // Each pending value with its parent's path and its own key: a path is only written out for a
  // container (its children need it) or for what is found, never for every plain string.
  const pending: [unknown, string, string | null][] = [[value, root, null]];
  const pathOf = (parent: string, key: string | null) =>
    key === null ? parent : `${parent}.${escapeText(key)}`;
  while (pending.length > 0) {
    const [v, parent, key] = pending.pop()!;
    if (typeof v === 'string') {
      const found = unsafeText(v);
      if (found) return { field: pathOf(parent, key), text: v, ...found };
    } else if (v && typeof v === 'object') {
      const path = pathOf(parent, key);
      if (Array.isArray(v)) {
        for (let i = v.length - 1; i >= 0; i--) pending.push([v[i], path, String(i)]);
        continue;
      }
      const entries = Object.entries(v);
      for (const [k] of entries) {
        const found = unsafeText(k);
        if (found) return { field: pathOf(path, k), text: k, ...found };
      }
      for (let i = entries.length - 1; i >= 0; i--) pending.push([entries[i]![1], path, entries[i]![0]]);
    }
  }
  return undefined;
}
