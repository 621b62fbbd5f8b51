import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config.ts';
import { systemClock } from '../../src/core/clock.ts';
import { createLogger } from '../../src/log.ts';
import { createCatalogue } from '../../src/server/catalogue.ts';
import { twinApprovals } from '../twins/approvals.ts';
import { twinAuditLog } from '../twins/audit-log.ts';
import { twinCatalogue } from '../twins/catalogue.ts';
import { twinClock } from '../twins/clock.ts';
import { twinConnector, twinConnectorSet } from '../twins/connectors.ts';
import { approvalsContract } from '../twins/contracts/approvals.ts';
import { auditLogContract } from '../twins/contracts/audit-log.ts';
import { catalogueContract } from '../twins/contracts/catalogue.ts';
import { clockContract } from '../twins/contracts/clock.ts';
import { CONTRACT_CONTACTS, connectorSetContract } from '../twins/contracts/connectors.ts';
import { rateLimiterContract } from '../twins/contracts/rate-limiter.ts';
import { twinRateLimiter } from '../twins/rate-limiter.ts';
import { agentOf } from '../twins/seam.ts';

/*
 * Each twin of test/twins/ held to its contract (test/twins/contracts/). The real stores are held to
 * the same contracts on each database in test/store/seam-stores.test.ts; the clock and the catalogue
 * need no database, so their real ones are held here too.
 */

const config = loadConfig({}, fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-twins-')));

clockContract('the twin', () => twinClock());
clockContract('the system clock', () => systemClock);

catalogueContract('the twin', config, (tools) => twinCatalogue(tools, config));
catalogueContract('the real one', config, (tools) =>
  createCatalogue({ tools, upstreams: [], config, log: createLogger('silent') }),
);

auditLogContract('the twin', async () => twinAuditLog());

let agents = 0;
rateLimiterContract('the twin', async () => ({
  limiter: twinRateLimiter(),
  agent: async () => `agent-${++agents}`,
}));

connectorSetContract('the twin', async () => {
  const executing = new Set<string>();
  return {
    set: twinConnectorSet({ local: twinConnector(CONTRACT_CONTACTS, (key) => executing.has(key)) }),
    executingKey: async () => {
      const key = randomUUID();
      executing.add(key);
      return key;
    },
  };
});

approvalsContract('the twin', async () => {
  const approvals = twinApprovals({ audit: twinAuditLog() });
  return {
    approvals,
    agents: [agentOf({ id: 'agent-a', name: 'a' }), agentOf({ id: 'agent-b', name: 'b' })],
    approve: async (id) => approvals.approve(id),
  };
});
