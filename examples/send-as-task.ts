/**
 * A countersign write asked once, as a task, and its result once a chair approved it:
 *
 *   COUNTERSIGN_URL=http://127.0.0.1:8787 COUNTERSIGN_AGENT_TOKEN=cs_… \
 *     node --import tsx examples/send-as-task.ts [2026-07-28|2025-11-25]
 *
 * It says on stderr that the task waits for a chair (the approvals web form lists it), waits for the
 * decision, then prints the tool's result as JSON on stdout.
 */
import { openTaskClient, type Revision } from './task-client.ts';

const url = process.env.COUNTERSIGN_URL ?? 'http://127.0.0.1:8787';
const message = {
  target_type: 'contact',
  target_id: 'ct_david',
  content_text: process.argv[3] ?? 'Hello from a task',
};

const tasks = await openTaskClient(
  url,
  process.env.COUNTERSIGN_AGENT_TOKEN ?? '',
  (process.argv[2] ?? '2026-07-28') as Revision,
);
const execution = await tasks.callTool('isphere_send_message', { ...message, dry_run: false });
console.error(`${execution.kind} ${execution.handle?.taskId ?? ''}: waiting for a chair to decide`);
console.log(JSON.stringify(await tasks.result(execution)));
await tasks.close();
