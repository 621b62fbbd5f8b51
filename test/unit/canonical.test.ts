import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import canonicalize from 'canonicalize';
import fc from 'fast-check';
import { canonicalJson, canonicalParsed, canonicalPicker } from '../../src/audit/canonical.ts';
import { AUDIT_FIELDS, canonicalRow, type AuditBody } from '../../src/audit/chain.ts';

/** The outcome of a serialiser: its text, or that it threw. */
function outcome(run: () => string | undefined): { text?: string; threw?: true } {
  try {
    return { text: run() };
  } catch {
    return { threw: true };
  }
}

const sameAsLibrary = (value: unknown) =>
  assert.deepEqual(
    outcome(() => canonicalJson(value)),
    outcome(() => canonicalize(value)),
    `differs for ${String(outcome(() => JSON.stringify(value)).text)}`,
  );

/** Strings of every kind: any code unit (lone surrogates included), Unicode, escapes. */
const anyString = fc.oneof(
  fc.string({ unit: 'binary' }),
  fc.string({ unit: fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)) }),
  fc.constantFrom('', '\u2028', '\u007f', '"\\/\b\f\n\r\t', '\ud800', '\udc00x', '😀', 'é'),
);

describe('canonical JSON (RFC 8785)', () => {
  it('is exactly what the canonicalize package produces, for any JSON value', () => {
    fc.assert(fc.property(fc.jsonValue(), sameAsLibrary), { numRuns: 2000 });
  });

  it('agrees on odd values too: lone surrogates, NaN, Infinity, -0, undefined, sparse arrays, Dates', () => {
    fc.assert(
      fc.property(
        fc.anything({
          key: anyString,
          values: [anyString, fc.double(), fc.constantFrom(undefined, -0, NaN, Infinity, 1e21, 5e-324)],
          withSparseArray: true,
          withNullPrototype: true,
          withDate: true,
        }),
        sameAsLibrary,
      ),
      { numRuns: 2000 },
    );
    for (const odd of [undefined, () => 1, [() => 1, 2], { f: () => 1 }, Symbol('s'), [Symbol('s')]])
      sameAsLibrary(odd);
  });

  it('writes what JSON.parse returned exactly as the canonicalize package does, keys remembered or not', () => {
    // One writer for the whole run, as an export uses one: its remembered keys must never leak into a
    // later value. Texts JSON.parse reads as a lone surrogate, Infinity (1e999) or -0 included.
    const write = canonicalParsed();
    const odd = [
      '"\\ud800"',
      '1e999',
      '-0',
      '[-0,1e21,1e-7,0.1,12345678901234567890]',
      '{"b":{"d":1,"c":2},"a":"\\u0000"}',
    ];
    const texts = fc.oneof(
      fc.jsonValue().map((v) => JSON.stringify(v)),
      fc.dictionary(anyString, fc.jsonValue({ maxDepth: 2 })).map((v) => JSON.stringify(v)),
      fc.constantFrom(...odd),
    );
    fc.assert(
      fc.property(texts, (text) => {
        const value: unknown = JSON.parse(text);
        assert.deepEqual(
          outcome(() => write(value)),
          outcome(() => canonicalize(value)),
          text,
        );
      }),
      { numRuns: 3000 },
    );
  });

  it('refuses a cycle', () => {
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic.self = cyclic;
    assert.throws(() => canonicalJson(cyclic), /Circular/);
  });

  it('picks and sorts a fixed set of fields, as if the picked object were serialised', () => {
    fc.assert(
      fc.property(
        fc.record(Object.fromEntries(AUDIT_FIELDS.map((f) => [f, fc.jsonValue({ maxDepth: 2 })])), {
          requiredKeys: [],
        }),
        (record) => {
          const picked = Object.fromEntries(AUDIT_FIELDS.map((f) => [f, record[f]]));
          assert.equal(canonicalRow(record as unknown as AuditBody), canonicalize(picked));
          assert.equal(
            canonicalPicker(['b', 'a'])({ a: record.seq, b: record.kind }),
            canonicalize({ a: record.seq, b: record.kind }),
          );
        },
      ),
      { numRuns: 500 },
    );
  });
});
