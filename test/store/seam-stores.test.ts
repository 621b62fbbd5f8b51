import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { after, describe } from 'node:test';
import { createAgent, createRateLimiter, createUser } from '../../src/accounts/index.ts';
import { createApprovals, WRITE_FENCE } from '../../src/approval/index.ts';
import { createAuditLog } from '../../src/audit/index.ts';
import { loadConfig } from '../../src/config.ts';
import {
  createBlobStore,
  createConnectorSet,
  createLocalConnector,
  importData,
} from '../../src/connectors/index.ts';
import { lazyHostRoots } from '../../src/db/host-roots.ts';
import type { HostRoots } from '../../src/core/host-roots.ts';
import type { Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type DbKind, type TestDatabase } from '../helpers/db.ts';
import { approvalsContract, type ApprovalsUnderTest } from '../twins/contracts/approvals.ts';
import { auditLogContract } from '../twins/contracts/audit-log.ts';
import { CONTRACT_CONTACTS, connectorSetContract } from '../twins/contracts/connectors.ts';
import { rateLimiterContract } from '../twins/contracts/rate-limiter.ts';

/*
 * The real stores the call seam uses, held to the contracts their twins are held to
 * (test/unit/twins-contract.test.ts), on PGlite and, with TEST_DATABASE_URL, on PostgreSQL: so that a
 * unit test over the twins says what the real seam does.
 */

/** One migrated database per kind, opened by the first case that needs it and shared by the rest. */
const opened = new Map<
  DbKind,
  Promise<{ testDb: TestDatabase; db: Database; roots: () => Promise<HostRoots> }>
>();
const databaseOf = (kind: DbKind) => {
  if (!opened.has(kind))
    opened.set(
      kind,
      openMigratedDatabase(kind).then(async ({ testDb, db }) => {
        // The host roots, opened before any record is made: users and agents are sealed under them (and
        // PGlite's one connection must not be asked to open them from inside a record's transaction).
        const config = loadConfig({ COUNTERSIGN_DATA_DIR: testDb.dataDir }, testDb.dataDir);
        const roots = lazyHostRoots(db.knex, config.secrets.host_roots_path);
        await roots();
        return { testDb, db, roots };
      }),
    );
  return opened.get(kind)!;
};
describe('the stores behind the call seam', () => {
  after(async () => {
    for (const open of opened.values()) {
      const { testDb, db } = await open;
      await db.close();
      await testDb.drop();
    }
  });

  let names = 0;
  const agentNamed = async (db: Database) => (await createAgent(db.knex, { name: `seam-${++names}` })).agent;

  /** The real approvals on the kind's database, two agents and a chair. */
  async function realApprovals(kind: DbKind): Promise<ApprovalsUnderTest> {
    const { db, testDb, roots } = await databaseOf(kind);
    const config = loadConfig({ COUNTERSIGN_DATA_DIR: testDb.dataDir }, testDb.dataDir);
    const approvals = createApprovals({
      knex: db.knex,
      audit: createAuditLog(db.knex),
      config,
      roots,
      reviewUrl: (id) => `https://countersign.test/approvals/${id}`,
    });
    const chair = await createUser(db.knex, {
      name: `chair-${++names}`,
      roles: ['chair'],
      password: 'contract-pass',
    });
    return {
      approvals,
      agents: [await agentNamed(db), await agentNamed(db)],
      async approve(id) {
        const view = await approvals.decide({ id, user: chair, decision: 'approve' });
        return view.approval_id!;
      },
    };
  }

  for (const kind of databaseKinds()) {
    auditLogContract(`audit_events on ${kind}`, async () => createAuditLog((await databaseOf(kind)).db.knex));

    rateLimiterContract(`rate_windows on ${kind}`, async () => {
      const { db } = await databaseOf(kind);
      return { limiter: createRateLimiter(db.knex), agent: async () => (await agentNamed(db)).id };
    });

    let imported: Promise<unknown> | undefined;
    connectorSetContract(`the local connector on ${kind}`, async () => {
      const { db, testDb } = await databaseOf(kind);
      const blobs = createBlobStore(path.join(testDb.dataDir, 'blobs'));
      imported ??= importData(db.knex, blobs, { contacts: CONTRACT_CONTACTS });
      await imported;
      return {
        set: createConnectorSet({ local: createLocalConnector(db.knex, blobs, WRITE_FENCE) }, 'local'),
        /** An approval executing, as the gate leaves it before it performs: its approval_id is the key. */
        async executingKey() {
          const { approvals, agents, approve } = await realApprovals(kind);
          const target = {
            target_type: 'contact',
            target_id: 'c_alan',
            display_name: 'Alan Turing',
          } as const;
          const text = `fence ${randomUUID()}`;
          const content_sha256 = Buffer.from(text).toString('hex').slice(0, 64).padEnd(64, '0');
          const ids = { request_id: randomUUID(), trace_id: randomUUID().replaceAll('-', '') };
          const { view } = await approvals.request({
            agent: agents[0],
            tool: 'send_message',
            source: 'local',
            target,
            content_sha256,
            file_sha256: null,
            review: { content_text: text },
            ...ids,
            facts: { facet: 'send', target, text },
          });
          const approval_id = await approve(view.approval_request_id);
          await approvals.beginExecution({
            agent: agents[0],
            tool: 'send_message',
            approval_id,
            target,
            content_sha256,
            file_sha256: null,
            source: 'local',
            ...ids,
          });
          return approval_id;
        },
      };
    });

    approvalsContract(`approval_requests on ${kind}`, () => realApprovals(kind));
  }
});
