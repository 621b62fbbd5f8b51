import { randomBytes } from 'node:crypto';
import type { Knex } from 'knex';
import { toCount } from '../db/knex.ts';
import type { BlobStore } from '../connectors/local/blobs.ts';
import { demoData } from '../connectors/local/demo.ts';
import { importData } from '../connectors/local/import.ts';
import { createAgent } from '../accounts/agents.ts';
import { createUser } from '../accounts/users.ts';
import type { AuditLog } from '../audit/log.ts';
import { isAppError } from '../core/errors.ts';

export interface FirstRun {
  token: string;
  /** A chair login, created when no user exists yet. */
  chair?: { name: string; password: string };
}

/**
 * On the very first start (no agent has ever been created), seeds the demo directory when the store is
 * empty, creates the `demo` agent and, when there is no user yet, a `chair` user. Returns the
 * credentials, to be shown once.
 */
/** The actor of what the first run creates. */
const FIRST_RUN = 'first-run';

export async function firstRun(knex: Knex, blobs: BlobStore, audit: AuditLog): Promise<FirstRun | undefined> {
  const agents = toCount((await knex('agents').count({ n: '*' }).first())?.n);
  if (agents > 0) return undefined;
  const contacts = toCount((await knex('contacts').count({ n: '*' }).first())?.n);
  if (contacts === 0) await importData(knex, blobs, demoData());
  let token: string;
  try {
    token = await knex.transaction(async (trx) => {
      const created = await createAgent(trx, { name: 'demo' });
      await audit.appendIn(trx, {
        kind: 'agent.created',
        actor: FIRST_RUN,
        agent_id: created.agent.id,
        result: 'ok',
        details: {
          agent: created.agent.name,
          profile: created.agent.profile,
          owner: null,
          rate_limit_per_min: null,
        },
      });
      return created.token;
    });
  } catch (err) {
    if (isAppError(err, 'CONFLICT')) return undefined; // another instance created it first
    throw err;
  }
  const users = toCount((await knex('users').count({ n: '*' }).first())?.n);
  if (users > 0) return { token };
  const password = randomBytes(12).toString('base64url');
  await knex.transaction(async (trx) => {
    const user = await createUser(trx, { name: 'chair', roles: ['chair'], password });
    await audit.appendIn(trx, {
      kind: 'user.created',
      actor: FIRST_RUN,
      result: 'ok',
      details: { user: user.name, roles: user.roles },
    });
  });
  return { token, chair: { name: 'chair', password } };
}
