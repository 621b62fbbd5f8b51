/**
 * One line, with the fix, for the ways a PostgreSQL connection commonly fails. Undefined for any other
 * error, which is then reported as it is. Never repeats the URL itself: it may hold a password.
 */
export function describePgError(e: unknown, url: string | undefined): string | undefined {
  if (!url || !(e instanceof Error)) return undefined;
  const u = new URL(url);
  const host = u.hostname || 'localhost';
  const where = `${host}:${u.port || '5432'}`;
  const database = decodeURIComponent(u.pathname.slice(1)) || decodeURIComponent(u.username);
  const user = decodeURIComponent(u.username) || 'the default user';
  switch (codeOf(e)) {
    case '3D000':
      return `database "${database}" does not exist on ${where}: create it (createdb -h ${host} -p ${u.port || '5432'} ${database}), or fix DATABASE_URL`;
    case '28P01':
    case '28000':
      return `PostgreSQL at ${where} refused user "${user}": authentication failed; check the user and password in DATABASE_URL`;
    case 'ECONNREFUSED':
    case 'ETIMEDOUT':
    case 'EHOSTUNREACH':
      return `PostgreSQL is not reachable at ${where} (${codeOf(e)}): start it, or fix the host and port in DATABASE_URL`;
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return `PostgreSQL is not reachable: host "${host}" is unknown; fix DATABASE_URL`;
    default:
      return undefined;
  }
}

/** The error's code; a refused connection to a name with several addresses is an AggregateError. */
function codeOf(e: Error): string | undefined {
  const code = (e as { code?: unknown }).code;
  if (typeof code === 'string') return code;
  const first = (e as { errors?: unknown[] }).errors?.[0];
  return first instanceof Error ? codeOf(first) : undefined;
}

/**
 * Connects once, before the command opens its pool, so that an unreachable or missing database is
 * reported as one line (the pool would first log each failed attempt with its stack).
 */
export async function postgresProblem(url: string): Promise<string | undefined> {
  const { default: pg } = await import('pg');
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 });
  client.on('error', () => {}); // a refused connection is reported by connect() below
  try {
    await client.connect();
    return undefined;
  } catch (e) {
    const line = describePgError(e, url);
    if (line) return line;
    throw e;
  } finally {
    await client.end().catch(() => {});
  }
}
