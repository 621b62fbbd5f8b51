import { RE2JS } from 're2js';

/**
 * Regular expressions in rules (`matches()`, `find()`) run on RE2 (re2js), whose matching time is
 * linear in the text: a pattern such as `^(\w+\s?)*$` cannot hold the event loop the way JavaScript's
 * backtracking engine does. RE2 has no look-around and no back-references; such a pattern is refused
 * when the policy is checked or stored (a pattern computed at evaluation time fails safe instead).
 */

/** What one rule's evaluation may spend on patterns: characters read, summed, and wall time. */
export const RULE_BUDGET = { chars: 1_000_000, ms: 20 } as const;

/** Thrown when a rule's evaluation goes past its budget: the rule then fails safe. */
export class RuleBudgetExceeded extends Error {}

interface Spending {
  chars: number;
  deadline: number;
}
let current: Spending | undefined;

/**
 * Runs `fn` (one rule's evaluation, synchronous) with a fresh budget. Patterns run inside it are
 * charged against it; past it they throw RuleBudgetExceeded.
 */
export function withBudget<T>(fn: () => T): T {
  const outer = current;
  current = { chars: RULE_BUDGET.chars, deadline: performance.now() + RULE_BUDGET.ms };
  try {
    return fn();
  } finally {
    current = outer;
  }
}

function charge(text: string): void {
  if (!current) return;
  current.chars -= text.length;
  if (current.chars < 0 || performance.now() > current.deadline) throw new RuleBudgetExceeded();
}

/** After a match: a match that ran past the deadline still fails its rule safe. */
function checkTime(): void {
  if (current && performance.now() > current.deadline) throw new RuleBudgetExceeded();
}

const CACHE_MAX = 256;
const cache = new Map<string, RE2JS>();

/** `pattern` compiled on RE2 (cached); throws RE2's syntax error for a pattern it cannot run. */
export function re2(pattern: string): RE2JS {
  let re = cache.get(pattern);
  if (!re) {
    re = RE2JS.compile(pattern);
    if (cache.size >= CACHE_MAX) cache.delete(cache.keys().next().value!);
    cache.set(pattern, re);
  }
  return re;
}

/** Why RE2 cannot run `pattern`, or undefined when it can. */
export function re2Error(pattern: string): string | undefined {
  try {
    re2(pattern);
    return undefined;
  } catch (err) {
    return (err instanceof Error ? err.message : String(err)).split('\n')[0];
  }
}

/** CEL's `text.matches(re)`: whether the pattern matches anywhere in the text (RE2 semantics). */
export function re2Matches(text: string, pattern: string): boolean {
  charge(text);
  const found = re2(pattern).matcher(text).find();
  checkTime();
  return found;
}

/** `text.find(re)`: the first capture group of the first match (the whole match without a group), or "". */
export function re2Find(text: string, pattern: string): string {
  charge(text);
  const m = re2(pattern).matcher(text);
  const found = m.find();
  checkTime();
  if (!found) return '';
  return (m.groupCount() > 0 ? m.group(1) : m.group(0)) ?? '';
}
