import type { Services } from './services.ts';
import { VERSION } from '../core/version.ts';

/** Liveness and counters: is the database reachable, how many calls, errors, overruns, pending approvals. */
export async function healthOf(
  s: Pick<
    Services,
    'approvals' | 'audit' | 'dialect' | 'metrics' | 'startedAt' | 'upstreams' | 'checkpoints'
  >,
) {
  let database: { reachable: boolean; dialect: string; error?: string } = {
    reachable: true,
    dialect: s.dialect,
  };
  let pending: number | null = null;
  let head: number | null = null;
  let policyTampered = false;
  try {
    // The policy as this replica holds it (read again at most once a second), its seal checked.
    const [p, h, policy] = await Promise.all([
      s.approvals.countPending(),
      s.audit.headSeq(),
      s.approvals.policy.current(),
    ]);
    [pending, head, policyTampered] = [p, h, policy.tampered === true];
  } catch (err) {
    database = { reachable: false, dialect: s.dialect, error: (err as Error).message.slice(0, 200) };
  }
  const upstreams = s.upstreams.map((u) => u.status());
  // Set once this process refused to sign a chain that contradicts the head it signed before.
  const tampered = s.checkpoints.guard?.tampered();
  return {
    status:
      database.reachable && upstreams.every((u) => u.state === 'up') && !tampered && !policyTampered
        ? 'ok'
        : 'degraded',
    version: VERSION,
    uptime_s: Math.round((Date.now() - s.startedAt.getTime()) / 1000),
    database,
    ...s.metrics.counters,
    pending_approvals: pending,
    audit_head_seq: head,
    audit_chain: tampered ? { state: 'tampered' as const, ...tampered } : { state: 'ok' as const },
    // TAMPERED: the stored approval policy does not carry its seal; every write needs review (docs/policy.md).
    approval_policy: { state: policyTampered ? ('tampered' as const) : ('sealed' as const) },
    upstreams,
  };
}
