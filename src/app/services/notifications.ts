import { startNotifications } from '../../notify/index.ts';
import { defineService } from './parts.ts';

/** Notices go out from the outbox on the leader's own loop; a change only queues them (docs/notifications.md). */
export const notifications = defineService({
  name: 'notifications',
  needs: ['db', 'audit', 'config', 'log', 'leadership'],
  provides: ['notifications'],
  open({ db, audit, config, log, leadership }, closers) {
    const notifications = startNotifications({ knex: db.knex, audit, config, log }, leadership);
    if (notifications) closers.push(() => notifications.close());
    return { notifications };
  },
});
