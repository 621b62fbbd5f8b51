import { createAuditLog } from '../../audit/index.ts';
import { defineService } from './parts.ts';

/** The audit log; on a stop, what it still holds is appended before the database closes. */
export const audit = defineService({
  name: 'audit',
  needs: ['db', 'roots'],
  provides: ['audit'],
  open({ db, roots }, closers) {
    const audit = createAuditLog(db.knex, { roots });
    closers.push(() => audit.drain());
    return { audit };
  },
});
