/** Edit distance (insertions, deletions, substitutions) between two strings, by code unit. */
export function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      row.push(Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + cost));
    }
    prev = row;
  }
  return prev[b.length]!;
}

/** Names longer than this are not compared: a "did you mean" for them would be a guess, and costly. */
const MAX_COMPARED = 128;

/**
 * The candidate closest to `given`, for a "did you mean": one that ends with it (a name without its
 * prefix, `send_message` for `isphere_send_message`), else the nearest by edit distance when at most a
 * third of the longer name differs. Undefined when nothing is that close.
 */
export function closestName(given: string, candidates: readonly string[]): string | undefined {
  if (given.length === 0 || given.length > MAX_COMPARED) return undefined;
  const lower = given.toLowerCase();
  const suffixed = candidates.find((c) => c.toLowerCase().endsWith(`_${lower}`));
  if (suffixed) return suffixed;
  let best: { name: string; distance: number } | undefined;
  for (const name of candidates) {
    const distance = editDistance(lower, name.toLowerCase());
    if (distance <= Math.max(given.length, name.length) / 3 && (!best || distance < best.distance))
      best = { name, distance };
  }
  return best?.name;
}
