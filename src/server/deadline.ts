import { AppError, isAppError } from '../core/errors.ts';

/** A call over its deadline: answered -32001, its late result discarded and counted. */
const overrun = (ms: number) =>
  new AppError('TIMEOUT', `the call exceeded its deadline of ${ms} ms`, 'call_deadline');
export const isOverrun = (err: unknown) => isAppError(err, 'TIMEOUT', 'call_deadline');

/**
 * Runs `work` under a deadline and the caller's cancellation, with one signal for both. Nothing outlives
 * the call: the timer is cleared and the listener on the caller's signal removed when it settles
 * (a per-call `AbortSignal.timeout` lived on for the whole deadline, holding the call's state with it,
 * and `AbortSignal.any` tied each call to the caller's signal).
 * Rejects with a TIMEOUT (reason call_deadline) at the deadline; a result that arrives later is reported to `late`.
 */
export function withDeadline<T>(
  caller: AbortSignal,
  ms: number,
  work: (signal: AbortSignal) => Promise<T>,
  late: () => void,
): Promise<T> {
  const controller = new AbortController();
  const cancel = () => controller.abort(caller.reason);
  let timer: NodeJS.Timeout | undefined;
  let overran = false;
  return new Promise<T>((resolve, reject) => {
    timer = setTimeout(() => {
      overran = true;
      const err = overrun(ms);
      controller.abort(err);
      reject(err);
    }, ms);
    if (caller.aborted) cancel();
    else caller.addEventListener('abort', cancel, { once: true });
    let running: Promise<T>;
    try {
      running = work(controller.signal);
    } catch (err) {
      running = Promise.reject(err);
    }
    running
      .finally(() => {
        clearTimeout(timer);
        caller.removeEventListener('abort', cancel);
        if (overran) late();
      })
      .then(resolve, reject);
  });
}
