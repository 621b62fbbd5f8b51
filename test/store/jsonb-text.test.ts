import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import canonicalize from 'canonicalize';
import { bytesOf } from '../../src/audit/bytes.ts';
import { JsonbText } from '../../src/audit/jsonb-text.ts';
import { type Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';

/** A small deterministic generator (xorshift), so that a failure names a value that can be found again. */
function random(seed: number) {
  let x = seed;
  const next = () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
  const pick = <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)]!;
  return { next, pick };
}

const STRINGS = [
  '',
  'plain',
  'a"quote',
  'back\\slash',
  'tab\tnew\nline',
  '\u0001\u001f\u007f',
  'é',
  '😀',
  '王伟',
];
const KEYS = ['a', 'b', 'ab', 'B', 'count', 'args_sha256', 'duration_ms', 'z', 'aa', '_', 'A1', ...STRINGS];
const NUMBERS = [
  0,
  1,
  -1,
  7,
  42,
  -300,
  2 ** 53 - 1,
  999999999999999,
  1e15,
  0.5,
  1.25,
  -0.001,
  1e21,
  1e-7,
  123.456,
];

function value(r: ReturnType<typeof random>, depth: number): unknown {
  const roll = r.next();
  if (depth > 3 || roll < 0.45) {
    const scalar = r.next();
    if (scalar < 0.4) return r.pick(STRINGS) + (r.next() < 0.5 ? String(Math.floor(r.next() * 1e6)) : '');
    if (scalar < 0.8) return r.pick(NUMBERS);
    return r.pick([true, false, null]);
  }
  if (roll < 0.65) return Array.from({ length: Math.floor(r.next() * 4) }, () => value(r, depth + 1));
  const object: Record<string, unknown> = {};
  const n = Math.floor(r.next() * 6);
  for (let i = 0; i < n; i++) object[r.pick(KEYS)] = value(r, depth + 1);
  return object;
}

/** The jsonb text the database writes for each value, in one query. */
async function jsonbTexts(db: Database, values: unknown[]): Promise<string[]> {
  const { rows } = (await db.knex.raw('select value::text as t from jsonb_array_elements(?::jsonb)', [
    JSON.stringify(values),
  ])) as { rows: { t: string }[] };
  return rows.map((row) => row.t);
}

/** The fast path's output for `text`, or undefined where it refused it. */
function fast(text: string): string | undefined {
  const src = Buffer.from(`xx${text}yy`); // not at the buffer's start, nor its end
  const out = Buffer.alloc(src.length + 8);
  const end = new JsonbText().write(bytesOf(src), 2, src.length - 2, bytesOf(out), 3);
  if (end === -1) return undefined;
  assert.ok(end - 3 <= Buffer.byteLength(text), 'never longer than the text');
  return out.toString('utf8', 3, end);
}

for (const kind of databaseKinds()) {
  describe(`canonical JSON straight from jsonb text on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    it('writes what the canonicalize package writes, or refuses', async () => {
      const r = random(20261201);
      const values = Array.from({ length: 3000 }, () => value(r, 0));
      const texts = await jsonbTexts(db, values);
      let taken = 0;
      for (const [i, text] of texts.entries()) {
        const got = fast(text);
        if (got === undefined) continue;
        taken++;
        assert.equal(got, canonicalize(JSON.parse(text)), `value ${i}: ${text}`);
      }
      assert.ok(taken > 1000, `the fast path took ${taken} of ${texts.length}`);
    });

    it('takes the shapes audit rows hold, and refuses what it cannot write as JCS does', async () => {
      const taken = [
        { count: 6, args_sha256: 'b'.repeat(64), duration_ms: 11 },
        {},
        [],
        ['chair-ada', 'chair-bo'],
        { reason: 'a "quoted" \\ reason\n', nested: { z: [1, 2, { y: null }], a: true } },
        { '': 'empty key', big: 999999999999999, small: -999999999999999, zero: 0 },
      ];
      for (const [i, text] of (await jsonbTexts(db, taken)).entries())
        assert.equal(fast(text), canonicalize(JSON.parse(text)), `value ${i}: ${text}`);

      const refused = [
        { n: 1.5 },
        { n: 1e21 },
        { n: 1e-7 },
        { n: 2 ** 53 - 1 }, // 16 digits
        { é: 1 },
        { 'a"b': 1 },
        { '😀': 1 },
        Array.from({ length: 20 }).reduce<unknown>((inner) => [inner], 1), // 20 levels deep
        Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, i])),
      ];
      for (const [i, text] of (await jsonbTexts(db, refused)).entries())
        assert.equal(fast(text), undefined, `value ${i}: ${text}`);
      // Text PostgreSQL would not write is refused too, not misread.
      for (const text of [
        '{"a":1}',
        '{"a": 1,"b": 2}',
        '[1,2]',
        '{"a": 01}',
        '"open',
        '{"a": 1',
        'nul',
        '-0',
        '1.0',
      ])
        assert.equal(fast(text), undefined, text);
    });
  });
}
