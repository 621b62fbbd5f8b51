/** The normalised form used for matching: NFKC and lower case, the same on every database collation. */
export function searchKey(...parts: (string | null | undefined)[]): string {
  return parts
    .filter((p): p is string => typeof p === 'string' && p.length > 0)
    .join('\u0001')
    .normalize('NFKC')
    .toLowerCase();
}

/** Escapes LIKE wildcards so user text matches literally. */
export function likeContains(text: string): string {
  return `%${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
}

export function likePrefix(text: string): string {
  return `${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
}
