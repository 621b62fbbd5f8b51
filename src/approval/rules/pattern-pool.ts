import { createRequire } from 'node:module';
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import { matchOne, type PatternJob, type PatternRunner, type PatternValue } from './patterns.ts';

/**
 * Worker threads that run the rules' long matches (patterns.ts), so that a long text under a pattern
 * never holds the server's event loop. A match gets the time its rule has left: past it, its worker is
 * terminated (re2js cannot be interrupted otherwise) and the rule fails safe; the next match starts a
 * new worker. Workers start when first needed, and not again after close().
 *
 * A worker runs plain JavaScript (no TypeScript loader), with only re2js loaded: the same `matchOne`
 * as the main thread, sent as its source.
 */

/** How many matches may wait for a worker; past it a match fails its rule safe at once. */
const QUEUE_MAX = 64;

/** How much nicer than the server a worker runs (Linux), so that it never takes the CPU from a call. */
const WORKER_NICE = 10;

/** A worker's heap: a match holds the text and RE2's small state, never more. */
const WORKER_HEAP_MB = 64;

const workerSource = (match: string) => `
// Below the server's main thread, where the system allows (Linux: this thread's own id): on a shared
// core the main thread's calls go first, and a long match waits (and, past its budget, fails safe).
try {
  const tid = Number(require('node:fs').readlinkSync('/proc/thread-self').split('/').pop());
  if (tid > 0) require('node:os').setPriority(tid, Math.min(19, require('node:os').getPriority(tid) + ${WORKER_NICE}));
} catch {}
const { parentPort, workerData } = require('node:worker_threads');
const { RE2JS } = require(workerData.re2js);
const matchOne = ${match};
const cache = new Map();
parentPort.on('message', (job) => {
  const t0 = performance.now();
  try {
    let re = cache.get(job.pattern);
    if (!re) {
      re = RE2JS.compile(job.pattern);
      if (cache.size >= 256) cache.delete(cache.keys().next().value);
      cache.set(job.pattern, re);
    }
    parentPort.postMessage({ value: matchOne(re, job.text, job.op), ms: performance.now() - t0 });
  } catch (err) {
    parentPort.postMessage({ error: String(err && err.message), ms: performance.now() - t0 });
  }
});
// Warm before ready (uncharged): re2js's matching code runs about five times slower until compiled,
// and a first long match would otherwise spend its rule's budget on that.
for (const p of ['^(\\\\w+\\\\s?)*$', '(?i)(\\\\d{3,})|([a-z]{2}\\\\d{2})']) {
  const re = RE2JS.compile(p);
  for (let i = 0; i < 4; i++) matchOne(re, 'word '.repeat(2000) + i, i % 2 ? 'find' : 'matches');
}
parentPort.postMessage('ready');
`;

/** Why a match did not run: the deadline, a full queue, a closed pool, or the worker's own failure. */
export class PatternRunFailed extends Error {
  constructor(readonly reason: 'deadline' | 'queue_full' | 'closed' | 'worker_failed') {
    super(`pattern not run: ${reason}`);
  }
}

interface Waiting {
  job: PatternJob;
  ms: number;
  resolve: (answer: { value: PatternValue; ms: number }) => void;
  reject: (err: PatternRunFailed) => void;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  busy?: { waiting: Waiting; started: number; timer: NodeJS.Timeout };
}

export interface PatternPool extends PatternRunner {
  /** Terminates every worker; waiting and running matches are refused (their rules fail safe). */
  close(): Promise<void>;
  /** Workers alive now, and how many were terminated at a deadline so far (tests, metrics). */
  stats(): { workers: number; terminated: number; waiting: number };
}

/** One worker: plain JavaScript (no TypeScript loader, whatever this process was started with), a small heap. */
const startWorker = (source: string, re2js: string) =>
  new Worker(source, {
    eval: true,
    workerData: { re2js },
    execArgv: [],
    resourceLimits: { maxOldGenerationSizeMb: WORKER_HEAP_MB },
  });

/** A pool of `size` workers (default: one per CPU but one, at most two, at least one). */
export function createPatternPool(
  size = Math.max(1, Math.min(2, os.availableParallelism() - 1)),
): PatternPool {
  const re2js = createRequire(import.meta.url).resolve('re2js');
  const source = workerSource(matchOne.toString());
  const slots = new Set<Slot>();
  const queue: Waiting[] = [];
  let terminated = 0;
  let closed = false;

  const finish = (slot: Slot) => {
    clearTimeout(slot.busy!.timer);
    const waiting = slot.busy!.waiting;
    slot.busy = undefined;
    return waiting;
  };

  const drop = (slot: Slot, why: PatternRunFailed['reason']) => {
    slots.delete(slot);
    if (slot.busy) finish(slot).reject(new PatternRunFailed(why));
    void slot.worker.terminate();
    // A worker that failed before it was ready would fail again: what waits is refused, not retried.
    if (!slot.ready) for (const waiting of queue.splice(0)) waiting.reject(new PatternRunFailed(why));
    dispatch();
  };

  const spawn = (): void => {
    const worker = startWorker(source, re2js);
    const slot: Slot = { worker, ready: false };
    slots.add(slot);
    worker.on('message', (m: 'ready' | { value?: PatternValue; error?: string; ms: number }) => {
      if (m === 'ready') slot.ready = true;
      else if (slot.busy) {
        const ms = performance.now() - slot.busy.started;
        const waiting = finish(slot);
        if (m.error !== undefined || m.value === undefined)
          waiting.reject(new PatternRunFailed('worker_failed'));
        else waiting.resolve({ value: m.value, ms });
      }
      dispatch();
    });
    worker.on('error', () => drop(slot, 'worker_failed'));
    worker.on('exit', () => {
      if (slots.has(slot)) drop(slot, 'worker_failed');
    });
  };

  function dispatch(): void {
    if (closed) return;
    for (const slot of slots) {
      if (!queue.length) return;
      if (!slot.ready || slot.busy) continue;
      const waiting = queue.shift()!;
      const timer = setTimeout(
        () => {
          terminated++;
          drop(slot, 'deadline');
        },
        Math.max(1, Math.ceil(waiting.ms)),
      );
      slot.busy = { waiting, started: performance.now(), timer };
      slot.worker.postMessage(waiting.job);
    }
    if (queue.length && slots.size < size) spawn();
  }

  return {
    run(job, ms) {
      if (closed) return Promise.reject(new PatternRunFailed('closed'));
      if (queue.length >= QUEUE_MAX) return Promise.reject(new PatternRunFailed('queue_full'));
      return new Promise((resolve, reject) => {
        queue.push({ job, ms, resolve, reject });
        dispatch();
      });
    },
    async close() {
      closed = true;
      for (const waiting of queue.splice(0)) waiting.reject(new PatternRunFailed('closed'));
      const all = [...slots];
      slots.clear();
      for (const slot of all) if (slot.busy) finish(slot).reject(new PatternRunFailed('closed'));
      await Promise.all(all.map((slot) => slot.worker.terminate()));
    },
    stats: () => ({ workers: slots.size, terminated, waiting: queue.length }),
  };
}
