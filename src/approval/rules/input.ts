import { flagsOf, normalizedText, skeletonOf } from '../../core/visible.ts';

export { normalizedText };

/**
 * What a rule's `when` sees of one write (docs/policy.md, "The input"). Every field is always present,
 * with an empty value where the write has none, so that an expression never fails on a missing key.
 * Integers are bigints, as CEL's `int` is 64-bit.
 */
export interface RuleInput {
  /** The tool's name, unprefixed (send_message, send_file) or an upstream's `<upstream>__<tool>`. */
  tool: string;
  facet: string;
  /** The upstream MCP server and its tool; empty strings for a built-in tool. */
  upstream: { name: string; tool: string };
  /** The upstream call's arguments; an empty map for a built-in tool. */
  arguments: Record<string, unknown>;
  target: {
    type: string;
    id: string;
    display_name: string;
    /** True unless the connector says the target is inside the organisation. */
    external: boolean;
    group: boolean;
    /** The group's member count where the connector knows it, else 0. */
    member_count: bigint;
  };
  content: {
    /** The message text or the file's caption, exactly as written. */
    text: string;
    /**
     * `text` without invisible characters or variation selectors, NFKC-normalised, every decimal digit
     * (`\p{Nd}`) as its ASCII digit, lower-cased (src/core/visible.ts, normalizedText).
     */
    normalized: string;
    /** The UTS #39 skeleton of `normalized`: look-alike letters of other scripts folded to one prototype. */
    skeleton: string;
    /**
     * What the text does to look like something else: invisible, bidi, mixed_script, confusable … For an
     * upstream write, of every string in its arguments too (keys and values): what it acts on is named there.
     */
    flags: string[];
    /** Length of `text` in code points. */
    length: bigint;
    file_name: string;
    file_size: bigint;
    file_type: string;
  };
  agent: { name: string; owner: string };
  /** When the write is drafted (or executed), in the policy's time zone. */
  time: { hour: bigint; minute: bigint; weekday: bigint };
}

/** The CEL declarations of RuleInput: the type checker holds every expression to them. */
export const INPUT_DECLARATIONS = {
  tool: 'string',
  facet: 'string',
  upstream: { name: 'string', tool: 'string' },
  arguments: 'map<string, dyn>',
  target: {
    type: 'string',
    id: 'string',
    display_name: 'string',
    external: 'bool',
    group: 'bool',
    member_count: 'int',
  },
  content: {
    text: 'string',
    normalized: 'string',
    skeleton: 'string',
    flags: 'list<string>',
    length: 'int',
    file_name: 'string',
    file_size: 'int',
    file_type: 'string',
  },
  agent: { name: 'string', owner: 'string' },
  time: { hour: 'int', minute: 'int', weekday: 'int' },
} as const satisfies Record<keyof RuleInput, string | Record<string, string>>;

/** The skeleton a rule compares with (content.skeleton, and CEL's `skeleton()`): of the normalized text. */
export const contentSkeleton = (text: string): string => skeletonOf(normalizedText(text));

const WEEKDAYS: Record<string, bigint> = { Sun: 0n, Mon: 1n, Tue: 2n, Wed: 3n, Thu: 4n, Fri: 5n, Sat: 6n };

/** One formatter per time zone: making one costs about 0.4 ms, using one a few µs. */
const formatters = new Map<string, Intl.DateTimeFormat>();
function formatterOf(timezone: string): Intl.DateTimeFormat {
  let f = formatters.get(timezone);
  if (!f) {
    f = new Intl.DateTimeFormat('en-GB', {
      timeZone: timezone,
      hour: '2-digit',
      minute: '2-digit',
      weekday: 'short',
      hourCycle: 'h23',
    });
    if (formatters.size >= 64) formatters.clear();
    formatters.set(timezone, f);
  }
  return f;
}

/** Hour, minute and weekday (0 = Sunday) of `at` in `timezone`. */
export function timeIn(at: Date, timezone: string): RuleInput['time'] {
  const parts = formatterOf(timezone).formatToParts(at);
  const part = (type: string) => parts.find((p) => p.type === type)?.value ?? '';
  return {
    hour: BigInt(Number(part('hour'))),
    minute: BigInt(Number(part('minute'))),
    weekday: WEEKDAYS[part('weekday')] ?? 0n,
  };
}

/** What the gate knows of a write, from which the input is built. */
export interface WriteFacts {
  tool: string;
  facet: string;
  upstream?: { name: string; tool: string; arguments: Record<string, unknown> };
  target: {
    target_type: string;
    target_id: string;
    display_name: string | null;
    external?: boolean;
    member_count?: number;
  };
  text: string;
  file?: { name: string; size: number; type: string };
  agent: { name: string; owner: string | null };
}

/** The strings of an upstream call's arguments read for content.flags: each up to this long, this many characters in all. */
export const ARGUMENT_FLAGS = { each: 256, total: 8192 } as const;

/**
 * The short strings of an upstream call's arguments, keys and values, at any depth, one a line: the
 * repository, path, address or name an upstream write acts on is one of them (a long one is a body). The
 * visible form costs about 2.5 µs a non-ASCII character, on the event loop: ARGUMENT_FLAGS bounds it.
 * Flags are of words, so one string a line changes none.
 */
function argumentText(value: unknown, out: string[] = [], budget = { left: ARGUMENT_FLAGS.total }): string[] {
  const take = (s: string) => {
    if (s.length <= ARGUMENT_FLAGS.each && s.length <= budget.left) {
      out.push(s);
      budget.left -= s.length;
    }
  };
  if (typeof value === 'string') take(value);
  else if (Array.isArray(value)) for (const v of value) argumentText(v, out, budget);
  else if (typeof value === 'object' && value !== null)
    for (const [k, v] of Object.entries(value)) {
      take(k);
      argumentText(v, out, budget);
    }
  return out;
}

export function inputOf(facts: WriteFacts, at: Date, timezone: string): RuleInput {
  const t = facts.target;
  return {
    tool: facts.tool,
    facet: facts.facet,
    upstream: { name: facts.upstream?.name ?? '', tool: facts.upstream?.tool ?? '' },
    arguments: facts.upstream?.arguments ?? {},
    target: {
      type: t.target_type,
      id: t.target_id,
      display_name: t.display_name ?? '',
      external: t.external ?? true,
      group: t.target_type === 'group',
      member_count: BigInt(t.member_count ?? 0),
    },
    content: {
      text: facts.text,
      normalized: normalizedText(facts.text),
      skeleton: contentSkeleton(facts.text),
      flags: flagsOf(
        facts.upstream ? [facts.text, ...argumentText(facts.upstream.arguments)].join('\n') : facts.text,
      ),
      length: BigInt([...facts.text].length),
      file_name: facts.file?.name ?? '',
      file_size: BigInt(facts.file?.size ?? 0),
      file_type: facts.file?.type ?? '',
    },
    agent: { name: facts.agent.name, owner: facts.agent.owner ?? '' },
    time: timeIn(at, timezone),
  };
}
