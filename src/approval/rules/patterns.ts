import { RE2JS } from 're2js';

/**
 * Regular expressions in rules (`matches()`, `find()`) run on RE2 (re2js), whose matching time is
 * linear in the text: a pattern such as `^(\w+\s?)*$` cannot hold the event loop the way JavaScript's
 * backtracking engine does. RE2 has no look-around and no back-references; such a pattern is refused
 * when the policy is checked or stored (a pattern computed at evaluation time fails safe instead).
 *
 * Linear is not free: re2js reads a text in time proportional to its length times the size of the
 * pattern's program (about 20–110 ns a character per instruction here, warm or cold), and a match
 * runs in one go. A match that would cost more than INLINE_COST runs on a worker thread
 * (pattern-pool.ts) when the evaluation has one, where a deadline stops it for real; the rule's
 * evaluation waits for it without holding the server's event loop (compile.ts, `holds`).
 */

/** What one rule's evaluation may spend on patterns: characters read, summed, and running time (ms). */
export const RULE_BUDGET: Budget = { chars: 1_000_000, ms: 20 };
export interface Budget {
  readonly chars: number;
  readonly ms: number;
}

/** How a policy runs its patterns: on which worker pool, if any, and within which budget (RULE_BUDGET). */
export interface PatternOptions {
  patterns?: PatternRunner;
  budget?: Budget;
}

/**
 * What one decision (every rule of one write) may run in the calling thread, in characters times
 * program instructions: about 0.4–2.2 ms of re2js on this machine (0.02–0.11 µs a unit, measured
 * warm and cold). Past it, with a worker pool, matches run on a worker.
 */
export const INLINE_COST = 20_000;

const CACHE_MAX = 256;
const cache = new Map<string, RE2JS>();

/** `pattern` compiled on RE2 (cached); throws RE2's syntax error for a pattern it cannot run. */
export function re2(pattern: string): RE2JS {
  let re = cache.get(pattern);
  if (!re) {
    re = RE2JS.compile(pattern);
    if (cache.size >= CACHE_MAX) cache.delete(cache.keys().next().value!);
    cache.set(pattern, re);
  }
  return re;
}

/** Why RE2 cannot run `pattern`, or undefined when it can. */
export function re2Error(pattern: string): string | undefined {
  try {
    re2(pattern);
    return undefined;
  } catch (err) {
    return (err instanceof Error ? err.message : String(err)).split('\n')[0];
  }
}

/** The two pattern functions of a rule: CEL's `matches()` and countersign's `find()`. */
export type PatternOp = 'matches' | 'find';

/** One match to run, and its answer: whether it matched (matches), or the text found (find). */
export interface PatternJob {
  op: PatternOp;
  pattern: string;
  text: string;
}
export type PatternValue = boolean | string;

/**
 * One match on a compiled pattern: `matches` whether it matches anywhere (RE2 semantics), `find` the
 * first capture group of the first match (the whole match without a group), or "". The worker thread
 * runs this same function (pattern-pool.ts sends it its source): it must stay self-contained.
 */
export function matchOne(re: RE2JS, text: string, op: PatternOp): PatternValue {
  const m = re.matcher(text);
  const found = m.find();
  if (op === 'matches') return found;
  if (!found) return '';
  return (m.groupCount() > 0 ? m.group(1) : m.group(0)) ?? '';
}

/** Runs a match off the calling thread within `ms` of running time; rejects past it (pattern-pool.ts). */
export interface PatternRunner {
  run(job: PatternJob, ms: number): Promise<{ value: PatternValue; ms: number }>;
}

/** Thrown when a rule's evaluation goes past its budget: the rule then fails safe. */
export class RuleBudgetExceeded extends Error {}

/** Thrown by a pattern function whose match waits for the worker: the evaluation runs again once it has it. */
class PatternPending extends Error {}

/**
 * One decision's patterns: answers already had (by pattern, then text), what may still run inline, and
 * the worker pool, if any. Shared by the rules of one decision, so that two rules reading the same
 * text with the same pattern run it once.
 */
export class PatternSession {
  private readonly answers = new Map<string, Map<string, PatternValue>>();
  private inline: number;
  private readonly runner?: PatternRunner;
  readonly limits: Budget;
  constructor(options: PatternOptions = {}) {
    this.runner = options.patterns;
    this.limits = options.budget ?? RULE_BUDGET;
    this.inline = this.runner ? INLINE_COST : Infinity;
  }

  /** A fresh budget for one rule's evaluation. */
  budget(): RuleBudget {
    return new RuleBudget(this);
  }

  known(job: PatternJob): PatternValue | undefined {
    return this.answers.get(job.pattern)?.get(job.text);
  }

  remember(job: PatternJob, value: PatternValue): void {
    let byText = this.answers.get(job.pattern);
    if (!byText) this.answers.set(job.pattern, (byText = new Map()));
    byText.set(job.text, value);
  }

  /** Whether a match of this cost may run in the calling thread; it is charged if so. */
  takeInline(cost: number): boolean {
    if (cost > this.inline) return false;
    this.inline -= cost;
    return true;
  }

  get pool(): PatternRunner | undefined {
    return this.runner;
  }
}

/**
 * One rule's evaluation: what its patterns may still read and run, whether it went past that, and the
 * matches that wait for the worker. The rule's expression is evaluated synchronously (CEL), a pattern
 * function called inside it answers through `call`; a match left for the worker throws, and once the
 * worker has answered it (`settle`) the expression is evaluated again from the start, with every
 * answer known: so the last evaluation is exactly the synchronous one.
 */
export class RuleBudget {
  private chars: number;
  private ms: number;
  exceeded = false;
  readonly pending: PatternJob[] = [];
  constructor(private readonly session: PatternSession) {
    this.chars = session.limits.chars;
    this.ms = session.limits.ms;
  }

  /** The answer of one pattern function, called from within the rule's synchronous evaluation. */
  call(job: PatternJob): PatternValue {
    const known = this.session.known(job);
    if (known !== undefined) return known;
    const re = re2(job.pattern);
    this.chars -= job.text.length;
    if (this.chars < 0 || this.ms <= 0) throw this.exceed();
    if (!this.session.takeInline(job.text.length * re.programSize())) {
      if (!this.pending.some((p) => p.pattern === job.pattern && p.text === job.text)) this.pending.push(job);
      throw new PatternPending();
    }
    const t0 = performance.now();
    const value = matchOne(re, job.text, job.op);
    this.ms -= performance.now() - t0;
    // A match that ran past the budget still fails its rule safe.
    if (this.ms < 0) throw this.exceed();
    this.session.remember(job, value);
    return value;
  }

  /** The matches left for the worker, run there one after another within what remains of the budget. */
  async settle(): Promise<void> {
    const pool = this.session.pool!;
    for (const job of this.pending.splice(0)) {
      if (this.ms <= 0) {
        this.exceed();
        return;
      }
      try {
        const answer = await pool.run(job, this.ms);
        this.ms -= answer.ms;
        this.session.remember(job, answer.value);
      } catch {
        this.exceed();
        return;
      }
    }
  }

  private exceed(): RuleBudgetExceeded {
    this.exceeded = true;
    return new RuleBudgetExceeded();
  }
}
