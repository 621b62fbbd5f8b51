// A separate process appending audit rows to PostgreSQL, for the cross-process chain test.
import { createAuditLog } from '../../src/audit/log.ts';
import { openDatabase } from '../../src/db/knex.ts';

const [url, worker, count] = [process.env.DATABASE_URL!, process.env.WORKER!, Number(process.env.COUNT)];
const db = await openDatabase({ url, pgliteDir: '', command: 'append worker' });
const log = createAuditLog(db.knex, { maxBatch: 8 });
await Promise.all(
  Array.from({ length: count }, (_, i) =>
    log.append({ kind: 'tool.call', tool: `worker-${worker}`, result: 'ok', details: { i } }),
  ),
);
await db.close();
