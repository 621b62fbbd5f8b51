import { randomUUID } from 'node:crypto';
import type { SeamApprovals } from '../../src/approval/index.ts';
import type { AuditLog } from '../../src/audit/index.ts';
import { approvalRequired, refuseOtherContent, type ExecutingRow } from '../../src/approval/execute.ts';
import { TASK_POLL_INTERVAL_MS, type TaskView } from '../../src/approval/tasks.ts';
import { asksOf, toView, type NamedRequestRow } from '../../src/approval/view.ts';
import { systemClock, type Clock } from '../../src/core/clock.ts';
import { AppError } from '../../src/core/errors.ts';
import type { Agent } from '../../src/core/identity.ts';
import { isUuid } from '../../src/core/ids.ts';

type Row = NamedRequestRow & { approvers: string[] };

/** What a test can do besides what the seam does: decide, as a chair would (an agent never can). */
export interface TwinApprovals extends SeamApprovals {
  /** Approves the request as `chair` (one approval completes it); returns its approval_id. */
  approve(approval_request_id: string, chair?: string): string;
  reject(approval_request_id: string, note?: string): void;
  /** Every request, as stored. */
  readonly requests: ReadonlyMap<string, Row>;
}

export interface TwinApprovalsOptions {
  /** Where the twin's audit rows go (approval.requested, write.started, write.*): the audit twin. */
  audit: Pick<AuditLog, 'append'>;
  clock?: Clock;
  /** The chair's review page, as ApprovalDeps.reviewUrl gives it. */
  reviewUrl?: (id: string) => string | null;
  /** How long a request waits for a decision (config approval.pending_ttl_s). */
  pending_ttl_s?: number;
}

const BINDINGS = {
  tool: 'tool',
  source: 'source',
  target: 'target',
  target_display: "target's display name",
  content: 'content',
} as const;

/**
 * The approvals' twin in memory: what the call seam uses of them (SeamApprovals) under the default
 * policy (one approval from a chair, no rules), with decisions made by the test. It refuses as the
 * real ones do (approval/execute.ts approvalRequired: unknown, pending, rejected, wrong_agent, consumed,
 * mismatch, expired) and appends the rows the real ones append, each on its own. Not modelled: policy
 * rules and their reopening, decision MACs, disabled approvers, notices. Held to the real approvals'
 * answers by test/twins/contracts/approvals.ts.
 */
export function twinApprovals(opts: TwinApprovalsOptions): TwinApprovals {
  const clock = opts.clock ?? systemClock;
  const reviewUrl = opts.reviewUrl ?? ((id: string) => `https://countersign.test/approvals/${id}`);
  const ttl = (opts.pending_ttl_s ?? 86_400) * 1000;
  const requests = new Map<string, Row>();
  const keys = new Map<string, { tool: string; content_sha256: string; approval_request_id: string }>();
  const tasks = new Map<
    string,
    { view: TaskView; agent_id: string; approval_request_id: string; tool: string }
  >();
  const viewOf = (row: Row) => toView(row, row.approvers, reviewUrl(row.id));
  const facts = (row: Row, details: Record<string, unknown> = {}) => ({
    agent_id: row.agent_id,
    tool: row.tool,
    source: row.source,
    target_type: row.target_type,
    target_ref: row.target_id,
    approval_request_id: row.id,
    approval_id: row.approval_id,
    content_sha256: row.content_sha256,
    file_sha256: row.file_sha256,
    details: { ...details, agent_name: row.agent_name },
  });
  const byApproval = (approval_id: string) =>
    [...requests.values()].find((r) => r.approval_id === approval_id);
  const expired = (row: Row) => new Date(row.expires_at) <= clock.now();

  /** The approval this approval_id names, if the agent may execute it (execute.ts lockApproval). */
  function check(agent: Agent, req: Parameters<SeamApprovals['preflight']>[0]): Row {
    const row = byApproval(req.approval_id);
    if (!row) {
      const asRequest = requests.get(req.approval_id);
      const own = asRequest?.agent_id === agent.id ? asRequest : undefined;
      if (own?.status === 'pending') throw approvalRequired('pending');
      if (own?.status === 'rejected') throw approvalRequired('rejected', own.note ?? undefined);
      if (own?.status === 'expired') throw approvalRequired('expired');
      throw approvalRequired('unknown');
    }
    if (row.agent_id !== agent.id) throw approvalRequired('wrong_agent');
    if (row.status === 'expired' || expired(row)) throw approvalRequired('expired');
    if (row.status !== 'approved') throw approvalRequired('consumed');
    const differs: keyof typeof BINDINGS | undefined =
      row.tool !== req.tool
        ? 'tool'
        : row.source !== req.source
          ? 'source'
          : row.target_type !== req.target.target_type || row.target_id !== req.target.target_id
            ? 'target'
            : row.target_display !== req.target.display_name
              ? 'target_display'
              : row.content_sha256 !== req.content_sha256
                ? 'content'
                : undefined;
    if (differs)
      throw new AppError(
        'APPROVAL_REQUIRED',
        `${approvalRequired('mismatch').message} (${BINDINGS[differs]} differs from what was approved)`,
        'mismatch',
        { details: { differs } },
      );
    return row;
  }

  /** A task as its request says it while it has no outcome of its own (approval/tasks.ts fromRequest). */
  const task = (t: { view: TaskView; approval_request_id: string; tool: string }): TaskView => {
    if (t.view.status !== 'working') return { ...t.view };
    const request = requests.get(t.approval_request_id)!;
    const url = reviewUrl(request.id);
    const where = url
      ? `a chair reviews it at ${url}`
      : `a chair decides it with: countersign approvals approve ${request.id} --as <chair>`;
    if (request.status === 'pending') return { ...t.view, statusMessage: `Waiting for approval: ${where}` };
    const lastUpdatedAt = [t.view.lastUpdatedAt, request.decided_at ?? ''].sort().at(-1)!;
    return {
      ...t.view,
      statusMessage: `Approved; the write is being executed (${t.tool})`,
      lastUpdatedAt,
    };
  };

  return {
    requests,
    approve(id, chair = 'chair') {
      const row = requests.get(id);
      if (!row || row.status !== 'pending') throw new Error(`request ${id} is not pending`);
      Object.assign(row, {
        status: 'approved',
        approval_id: randomUUID(),
        approvers: [...row.approvers, chair],
        decided_at: clock.now().toISOString(),
      });
      return row.approval_id!;
    },
    reject(id, note) {
      const row = requests.get(id);
      if (!row || row.status !== 'pending') throw new Error(`request ${id} is not pending`);
      Object.assign(row, { status: 'rejected', note: note ?? null, decided_at: clock.now().toISOString() });
    },
    async request(draft) {
      if (draft.idempotency_key) {
        const prior = keys.get(`${draft.agent.id}\u0000${draft.idempotency_key}`);
        if (prior) refuseOtherContent(prior, draft);
      }
      const open = [...requests.values()].find(
        (r) =>
          r.agent_id === draft.agent.id &&
          r.content_sha256 === draft.content_sha256 &&
          (r.status === 'pending' || r.status === 'approved'),
      );
      if (open) return { view: viewOf(open), created: false, asks: asksOf(open) };
      const now = clock.now();
      const row: Row = {
        id: randomUUID(),
        agent_id: draft.agent.id,
        agent_name: draft.agent.name,
        tool: draft.tool,
        source: draft.source,
        target_type: draft.target.target_type,
        target_id: draft.target.target_id,
        target_display: draft.target.display_name,
        content_sha256: draft.content_sha256,
        file_sha256: draft.file_sha256,
        review: draft.review,
        status: 'pending',
        approval_id: null,
        required_approvers: 1,
        policy_version: 'twin',
        policy_rule: null,
        policy_requirement: null,
        note: null,
        created_at: now.toISOString(),
        expires_at: new Date(now.getTime() + ttl).toISOString(),
        decided_at: null,
        execution_started_at: null,
        execution_finished_at: null,
        execution_result: null,
        execution_error: null,
        execution_source: null,
        decision_mac: null,
        approvers: [],
      };
      await opts.audit.append({
        kind: 'approval.requested',
        ...facts(row),
        request_id: draft.request_id,
        trace_id: draft.trace_id,
        dry_run: true,
        result: 'ok',
      });
      requests.set(row.id, row);
      return { view: viewOf(row), created: true, asks: asksOf(row) };
    },
    async preflight(req) {
      try {
        if (req.idempotency_key) {
          const prior = keys.get(`${req.agent.id}\u0000${req.idempotency_key}`);
          if (prior) {
            refuseOtherContent(prior, req);
            const message =
              'this idempotency_key already ran this write: a real run returns its stored outcome';
            return { would_execute: false, code: null, reason: 'replayed', message };
          }
        }
        check(req.agent, req);
        return { would_execute: true, code: null, reason: null, message: null };
      } catch (err) {
        if (!(err instanceof AppError)) throw err;
        return { would_execute: false, code: err.code, reason: err.reason ?? null, message: err.message };
      }
    },
    async readApproval(approval_id) {
      const row = isUuid(approval_id) ? byApproval(approval_id) : undefined;
      return row ? { ...row } : undefined;
    },
    async beginExecution(req) {
      if (req.idempotency_key) {
        const prior = keys.get(`${req.agent.id}\u0000${req.idempotency_key}`);
        if (prior) {
          refuseOtherContent(prior, req);
          return { row: { ...requests.get(prior.approval_request_id)! }, replay: true };
        }
      }
      const row = check(req.agent, req);
      Object.assign(row, {
        status: 'executing',
        execution_started_at: clock.now().toISOString(),
        execution_source: req.source,
      });
      if (req.idempotency_key)
        keys.set(`${req.agent.id}\u0000${req.idempotency_key}`, {
          tool: row.tool,
          content_sha256: row.content_sha256,
          approval_request_id: row.id,
        });
      const task = req.task_id ? { origin: 'task', task_id: req.task_id } : {};
      await opts.audit.append({
        kind: 'write.started',
        ...facts(row, task),
        request_id: req.request_id,
        trace_id: req.trace_id,
        source: req.source,
        approvers: row.approvers,
        dry_run: false,
      });
      const executing: ExecutingRow = { ...row, approvers: [...row.approvers] };
      return { row: executing, replay: false };
    },
    async finishExecution(executing, outcome, ctx) {
      const row = requests.get(executing.id);
      if (!row || row.status !== 'executing') return false;
      Object.assign(row, {
        status: outcome.status,
        execution_finished_at: clock.now().toISOString(),
        execution_result: outcome.status === 'succeeded' ? outcome.result : null,
        execution_error: outcome.status === 'succeeded' ? null : outcome.error_code,
      });
      const kind = `write.${outcome.status}` as const;
      await opts.audit.append({
        kind,
        ...facts(row, {
          ...(outcome.status === 'succeeded' ? {} : (outcome.details ?? {})),
          ...(ctx.task_id ? { origin: 'task', task_id: ctx.task_id } : {}),
        }),
        request_id: ctx.request_id ?? null,
        trace_id: ctx.trace_id ?? null,
        source: ctx.source ?? row.source,
        approvers: row.approvers,
        dry_run: false,
        result: outcome.status === 'succeeded' ? 'ok' : 'error',
        error_code: outcome.status === 'succeeded' ? null : outcome.error_code,
      });
      return true;
    },
    async getOwn(agent, by) {
      if (!isUuid(by.approval_request_id) && !isUuid(by.approval_id)) return undefined;
      const row = [...requests.values()].find(
        (r) =>
          r.agent_id === agent.id &&
          (by.approval_request_id === undefined || r.id === by.approval_request_id) &&
          (by.approval_id === undefined || r.approval_id === by.approval_id),
      );
      return row && viewOf(row);
    },
    async listOwn(agent, { status, limit, after }) {
      const rows = [...requests.values()]
        .filter((r) => r.agent_id === agent.id && (!status || r.status === status))
        .sort((a, b) =>
          a.created_at === b.created_at ? (a.id < b.id ? 1 : -1) : a.created_at < b.created_at ? 1 : -1,
        )
        .filter((r) => !after || r.created_at < after.t || (r.created_at === after.t && r.id < after.id));
      const page = rows.slice(0, limit);
      const last = page.at(-1);
      return {
        items: page.map(viewOf),
        next: rows.length > limit && last ? { t: last.created_at, id: last.id } : null,
      };
    },
    tasks: {
      async create(draft) {
        const found = [...tasks.values()].find((t) => t.approval_request_id === draft.approval_request_id);
        if (found) return task(found);
        const at = clock.now().toISOString();
        const request = requests.get(draft.approval_request_id)!;
        const view: TaskView = {
          taskId: randomUUID(),
          status: 'working',
          statusMessage: '',
          createdAt: at,
          lastUpdatedAt: at,
          ttlMs: Math.max(0, new Date(request.expires_at).getTime() - Date.parse(at)),
          pollIntervalMs: TASK_POLL_INTERVAL_MS,
        };
        tasks.set(view.taskId, {
          view,
          agent_id: draft.agent_id,
          approval_request_id: draft.approval_request_id,
          tool: draft.tool,
        });
        return task(tasks.get(view.taskId)!);
      },
      async get(agent, id) {
        const t = tasks.get(id);
        return t && t.agent_id === agent.id ? task(t) : undefined;
      },
      async getMany(agent, ids) {
        return ids.flatMap((id) => {
          const t = tasks.get(id);
          return t && t.agent_id === agent.id ? [task(t)] : [];
        });
      },
      async list(agent, { limit }) {
        const own = [...tasks.values()].filter((t) => t.agent_id === agent.id).reverse();
        return { items: own.slice(0, limit).map(task), next: null };
      },
      async cancel(agent, id) {
        const t = tasks.get(id);
        if (!t || t.agent_id !== agent.id) return { kind: 'not_found' };
        if (t.view.status !== 'working') return { kind: 'terminal', view: task(t) };
        const request = requests.get(t.approval_request_id)!;
        if (request.status !== 'pending' && request.status !== 'approved')
          return { kind: 'started', view: task(t) };
        const from = request.status;
        request.status = 'expired';
        t.view = {
          ...t.view,
          status: 'cancelled',
          statusMessage: 'Cancelled: the request was withdrawn',
          lastUpdatedAt: clock.now().toISOString(),
        };
        await opts.audit.append({ kind: 'approval.withdrawn', ...facts(request, { from, task_id: id }) });
        return { kind: 'cancelled', view: task(t) };
      },
    },
  };
}
