/**
 * How scripts/test.ts deals test files into processes. Files whose measure is the process itself (the
 * live heap of test/e2e/memory.test.ts) run in a group of their own, and go first: they are the longest.
 */

/** Test files that run in a process of their own: what they measure is the process. */
export const ALONE = ['test/e2e/memory.test.ts'];

/** The files dealt into at most `groups` groups besides those that run alone; every file in exactly one. */
export function deal(files: string[], groups: number): string[][] {
  const alone = files.filter((f) => ALONE.includes(f)).map((f) => [f]);
  const rest = files.filter((f) => !ALONE.includes(f));
  const count = Math.max(1, Math.min(groups, rest.length));
  const dealt: string[][] = Array.from({ length: count }, () => []);
  rest.forEach((f, i) => dealt[i % count]!.push(f));
  return [...alone, ...dealt.filter((g) => g.length > 0)];
}
