/**
 * RFC 8785 canonical JSON (JCS), for the audit chain's hot paths: every append, export and verify
 * serialises each row once. It produces exactly what the `canonicalize` package produces, and throws
 * where it throws (NaN, Infinity, lone surrogates, cycles) — test/unit/canonical.test.ts holds the two to
 * the same output on random values — at a fraction of the cost: strings are checked with the native
 * isWellFormed() instead of a loop over their characters, and a row's keys are sorted once, not per row.
 */

/** ES2024's String.prototype.isWellFormed, native in every Node this project runs on (>= 20). */
const isWellFormed = (s: string) => (s as string & { isWellFormed(): boolean }).isWellFormed();

function canonicalString(s: string): string {
  if (!isWellFormed(s)) throw new Error('Lone surrogate is not allowed');
  return JSON.stringify(s);
}

function canonicalNumber(n: number): string {
  if (Number.isNaN(n)) throw new Error('NaN is not allowed');
  if (!Number.isFinite(n)) throw new Error('Infinity is not allowed');
  return JSON.stringify(n);
}

/** JCS of any value; `undefined` where JSON has no text for it (a function, a symbol, undefined). */
export function canonicalJson(value: unknown, seen: Set<object> = new Set()): string {
  switch (typeof value) {
    case 'string':
      return canonicalString(value);
    case 'number':
      return canonicalNumber(value);
    case 'object':
      break;
    default:
      return JSON.stringify(value);
  }
  if (value === null) return 'null';
  if (seen.has(value)) throw new Error('Circular reference detected');
  const toJSON = (value as { toJSON?: unknown }).toJSON;
  if (typeof toJSON === 'function') {
    seen.add(value);
    const result = canonicalJson(toJSON.call(value), seen);
    seen.delete(value);
    return result;
  }
  seen.add(value);
  let out: string;
  if (Array.isArray(value)) {
    out = '[';
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out += ',';
      if (!(i in value)) continue; // a hole, as Array.prototype.join prints it
      const v: unknown = value[i];
      out += v === undefined || typeof v === 'symbol' ? 'null' : (canonicalJson(v, seen) ?? '');
    }
    out += ']';
  } else {
    out = '{';
    let first = true;
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      if (v === undefined || typeof v === 'symbol') continue;
      out += `${first ? '' : ','}${canonicalString(key)}:${canonicalJson(v, seen)}`;
      first = false;
    }
    out += '}';
  }
  seen.delete(value);
  return out;
}

/**
 * JCS of the object made of `fields` of `record` (in any order; sorted here once, as JCS sorts keys).
 * The same as canonicalJson of that object, without building it: a field that is absent is left out.
 */
export function canonicalPicker<K extends string>(
  fields: readonly K[],
): (record: { readonly [P in K]?: unknown }) => string {
  const sorted = [...fields].sort();
  const keys = sorted.map((k) => `${canonicalString(k)}:`);
  return (record) => {
    let out = '{';
    let first = true;
    for (let i = 0; i < sorted.length; i++) {
      const v = record[sorted[i]!];
      if (v === undefined || typeof v === 'symbol') continue;
      out += `${first ? '' : ','}${keys[i]}${v === null ? 'null' : canonicalJson(v)}`;
      first = false;
    }
    return `${out}}`;
  };
}

/** Keys remembered by one canonicalParsed: a row's jsonb columns use few distinct keys, over and over. */
const MEMO_KEYS = 1024;

/**
 * A function that writes the JCS of a value JSON.parse returned — canonicalJson's output, for the
 * export's jsonb columns — without what only other values need (toJSON, cycles, undefined, symbols,
 * holes: a parsed value has none), and with each key's `"key":` written once and remembered.
 */
export function canonicalParsed(): (value: unknown) => string {
  const keys = new Map<string, string>();
  const key = (k: string) => {
    let text = keys.get(k);
    if (text === undefined) {
      text = `${canonicalString(k)}:`;
      if (keys.size < MEMO_KEYS) keys.set(k, text);
    }
    return text;
  };
  const write = (value: unknown): string => {
    switch (typeof value) {
      case 'string':
        return canonicalString(value);
      case 'number':
        return canonicalNumber(value);
      case 'boolean':
        return value ? 'true' : 'false';
      default:
        if (value === null) return 'null';
    }
    let out: string;
    if (Array.isArray(value)) {
      out = '[';
      for (let i = 0; i < value.length; i++) out += `${i > 0 ? ',' : ''}${write(value[i])}`;
      return `${out}]`;
    }
    const record = value as Record<string, unknown>;
    const sorted = Object.keys(record).sort();
    out = '{';
    for (let i = 0; i < sorted.length; i++)
      out += `${i > 0 ? ',' : ''}${key(sorted[i]!)}${write(record[sorted[i]!])}`;
    return `${out}}`;
  };
  return write;
}
