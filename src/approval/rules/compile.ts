import { Environment, type ParseResult } from '@marcbachmann/cel-js';
import { serialize } from '@marcbachmann/cel-js/serialize';
import { AppError } from '../../core/errors.ts';
import { contentSkeleton, INPUT_DECLARATIONS, inputOf, type RuleInput, type WriteFacts } from './input.ts';
import { PolicyDoc, versionOf, type Rule } from '../../core/approval-policy.ts';
import { PatternSession, re2Error, type PatternOptions, type RuleBudget } from './patterns.ts';

/** What a policy asks of one write: who must countersign, or a refusal, or no review at all. */
export type Requirement =
  | { kind: 'require'; approvers: number; roles?: string[]; users?: string[] }
  | { kind: 'deny'; reason: string }
  | { kind: 'allow_without_review'; reason: string };

/** The rule that matched (null: none did, the per-tool default applies), what it asks, and the version. */
export interface Decision {
  rule: string | null;
  requirement: Requirement;
  version: string;
}

export interface CompiledPolicy {
  readonly doc: PolicyDoc;
  readonly version: string;
  /**
   * The first matching rule's requirement for this write at `at`, or the per-tool default. Asynchronous:
   * a long match runs on the pattern pool, if the policy was compiled with one.
   */
  decide(facts: WriteFacts, at?: Date): Promise<Decision>;
  /** The same, for an input already built (policy explain, the bench). */
  decideInput(input: RuleInput): Promise<Decision>;
  /** What applies when no rule matches: the tool's `approval.required_approvers`, else one. */
  defaultFor(tool: string): Decision;
}

/** What every `matches()` of a rule calls instead: RE2's (onRe2, below). */
const RE2_MATCHES = 're2_matches';

/** The rule being evaluated now: its pattern functions answer through its budget (set by `holds`). */
interface Evaluating {
  budget?: RuleBudget;
}

/**
 * A pattern function of a rule: the answer through the budget of the rule being evaluated (patterns.ts).
 * Evaluation is synchronous, so the rule being evaluated is the one `holds` set; a policy has its own.
 */
const patternFn =
  <T extends string | boolean>(evaluating: Evaluating, op: 'matches' | 'find') =>
  (text: string, pattern: string): T => {
    if (!evaluating.budget) throw new Error('a pattern evaluated outside a rule evaluation');
    return evaluating.budget.call({ op, pattern, text }) as T;
  };

/** The CEL environment every rule is checked and evaluated in: the input's fields, typed, and nothing else. */
function environment(evaluating: Evaluating): Environment {
  const env = new Environment({
    unlistedVariablesAreDyn: false,
    limits: { maxAstNodes: 2000, maxDepth: 50 },
  });
  for (const [name, type] of Object.entries(INPUT_DECLARATIONS)) {
    if (typeof type === 'string') env.registerVariable(name, type);
    else env.registerVariable({ name, schema: { ...type } });
  }
  // `text.find(re)`: the first capture group of the first match (the whole match without a group), or "".
  env.registerFunction({
    name: 'find',
    receiverType: 'string',
    returnType: 'string',
    params: [{ name: 'pattern', type: 'string' }],
    handler: patternFn<string>(evaluating, 'find'),
    async: false,
  });
  // CEL's own `matches()` runs on JavaScript's backtracking engine and cannot be replaced in the
  // environment: every call of it in a rule is renamed to this one at compile time (onRe2, below).
  env.registerFunction({
    name: RE2_MATCHES,
    receiverType: 'string',
    returnType: 'bool',
    params: [{ name: 'pattern', type: 'string' }],
    handler: patternFn<boolean>(evaluating, 'matches'),
    async: false,
  });
  // `skeleton("payroll")`: the skeleton of a word as content.skeleton holds the text's, to compare them.
  env.registerFunction({
    name: 'skeleton',
    returnType: 'string',
    params: [{ name: 'text', type: 'string' }],
    handler: contentSkeleton,
  });
  return env;
}

/** Every `x.matches(p)` call in `node` renamed to RE2_MATCHES, in place; whether one was. */
function renameMatches(node: unknown): boolean {
  if (Array.isArray(node)) return node.map(renameMatches).some(Boolean);
  if (!isNode(node) || node.op === 'value') return false;
  let renamed = false;
  if (node.op === 'rcall' && Array.isArray(node.args) && node.args[0] === 'matches') {
    node.args[0] = RE2_MATCHES;
    renamed = true;
  }
  return renameMatches(node.args) || renamed;
}

/** `parsed` with every `matches()` running on RE2: the renamed tree written out and parsed again. */
function onRe2(env: Environment, parsed: ParseResult): ParseResult {
  return renameMatches(parsed.ast) ? env.parse(serialize(parsed.ast)) : parsed;
}

/** A rule refused at load: its name and the compiler's first line, for the operator. */
const ruleError = (rule: Rule, message: string) =>
  new AppError('CONFIG_INVALID', `approval rule "${rule.name}": ${message}`, 'rule_invalid', {
    details: { rule: rule.name },
  });

function compileRule(env: Environment, rule: Rule): ParseResult {
  let parsed: ParseResult;
  try {
    parsed = onRe2(env, env.parse(rule.when));
  } catch (err) {
    throw ruleError(rule, firstLine(err));
  }
  const checked = parsed.check();
  if (!checked.valid) throw ruleError(rule, firstLine(checked.error));
  if (checked.type !== 'bool') throw ruleError(rule, `"when" is of type ${checked.type}, not bool`);
  const bad = badPattern(parsed.ast);
  if (bad) throw ruleError(rule, bad);
  if ('require' in rule.then && (rule.then.require.users?.length ?? Infinity) < rule.then.require.approvers)
    throw ruleError(rule, 'asks for more approvers than it names users');
  if ('require' in rule.then && rule.then.require.users) {
    // Names are compared as stored; one spelled otherwise would never count, so the rule could never be met.
    for (const u of rule.then.require.users)
      if (!/^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/.test(u)) throw ruleError(rule, `"${u}" is not a user name`);
  }
  return parsed;
}

/** Node kinds whose `args` hold further nodes (a literal's args are its value). */
const isNode = (v: unknown): v is { op: string; args: unknown } =>
  typeof v === 'object' && v !== null && 'op' in v && 'args' in v;

/**
 * The first literal pattern of a `find()` or `matches()` call in `node` that RE2 cannot run (invalid,
 * or look-around and back-references, which need backtracking), as its message: refused at load rather
 * than failing (safe, but silently) on every call.
 */
function badPattern(node: unknown): string | undefined {
  if (Array.isArray(node)) {
    for (const n of node) {
      const bad = badPattern(n);
      if (bad) return bad;
    }
    return undefined;
  }
  if (!isNode(node) || node.op === 'value') return undefined;
  if (node.op === 'rcall' && Array.isArray(node.args)) {
    const [name, , params] = node.args as [unknown, unknown, unknown];
    const first = Array.isArray(params) ? (params[0] as unknown) : undefined;
    if ((name === 'find' || name === RE2_MATCHES) && isNode(first) && first.op === 'value') {
      const bad = re2Error(String(first.args));
      if (bad) return `${name === 'find' ? 'find' : 'matches'}() pattern: RE2 cannot run it: ${bad}`;
    }
  }
  return badPattern(node.args);
}

const firstLine = (err: unknown) => (err instanceof Error ? err.message : String(err)).split('\n')[0]!;

/** What a rule asks when it matches. */
export const requirementOf = (rule: Rule): Requirement => {
  const then = rule.then;
  if ('deny' in then) return { kind: 'deny', reason: then.deny.reason };
  if ('allow_without_review' in then)
    return { kind: 'allow_without_review', reason: then.allow_without_review.reason };
  return { kind: 'require', ...then.require };
};

/**
 * Whether a rule holds. An expression that fails on this input (a `double()` of text that is no number),
 * or whose patterns go past the evaluation's budget (patterns.ts, RULE_BUDGET), fails safe: it counts
 * as matching when its rule asks for review or refuses, and as not matching when it would let the write
 * through without review. Long matches wait for the worker (RuleBudget), then the rule is evaluated again.
 */
async function holds(
  evaluating: Evaluating,
  session: PatternSession,
  { fn, rule }: { fn: ParseResult; rule: Rule },
  input: RuleInput,
): Promise<boolean> {
  const failSafe = !('allow_without_review' in rule.then);
  const budget = session.budget();
  for (;;) {
    let value: unknown;
    let failed = false;
    evaluating.budget = budget;
    try {
      value = fn(input);
    } catch {
      failed = true;
    } finally {
      evaluating.budget = undefined;
    }
    if (budget.exceeded) return failSafe;
    if (budget.pending.length === 0) return failed ? failSafe : value === true;
    await budget.settle();
  }
}

/**
 * Compiles and type-checks every rule; the first that does not compile is refused with its name
 * (CONFIG_INVALID, reason rule_invalid), so a bad policy stops start-up or is refused on edit.
 */
/**
 * The fix for a document that is a rule or a list of rules rather than a policy, the commonest slip: a
 * policy is `{"rules": [...]}` (with an optional timezone) around them.
 */
function shapeHint(raw: unknown): string {
  if (Array.isArray(raw)) return '; a policy is an object: wrap the list as {"rules": [ … ]}';
  const isRule =
    typeof raw === 'object' && raw !== null && !('rules' in raw) && ('when' in raw || 'then' in raw);
  return isRule
    ? '; this is one rule, not a policy: wrap it as {"rules": [ {"name": …, "when": …, "then": …} ]}'
    : '';
}

export function compilePolicy(
  raw: unknown,
  requiredApprovers: Readonly<Record<string, number>>,
  patterns: PatternOptions = {},
): CompiledPolicy {
  const parsed = PolicyDoc.safeParse(raw ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new AppError(
      'CONFIG_INVALID',
      `approval policy ${issue.path.join('.') || '(root)'}: ${issue.message}${shapeHint(raw)}`,
      'policy_invalid',
    );
  }
  const doc = parsed.data;
  const evaluating: Evaluating = {};
  const env = environment(evaluating);
  const compiled = doc.rules.map((rule) => ({ rule, fn: compileRule(env, rule) }));
  const version = versionOf(doc, requiredApprovers);
  const decideInput = async (input: RuleInput): Promise<Decision> => {
    // Without a pattern pool (the CLI, a test), every match runs in the calling thread.
    const session = new PatternSession(patterns);
    for (const c of compiled) {
      if (await holds(evaluating, session, c, input))
        return { rule: c.rule.name, requirement: requirementOf(c.rule), version };
    }
    return defaultFor(input.tool);
  };
  const defaultFor = (tool: string): Decision => ({
    rule: null,
    requirement: { kind: 'require', approvers: requiredApprovers[tool] ?? 1 },
    version,
  });
  return {
    doc,
    version,
    decideInput,
    defaultFor,
    decide: (facts, at = new Date()) => decideInput(inputOf(facts, at, doc.timezone)),
  };
}

/**
 * Whether `now` asks more than `then`, the requirement an approval was given under: a refusal, more
 * approvers, or people the earlier requirement did not already accept. Asking the same or less proceeds.
 */
export function asksMore(now: Requirement, then: Requirement): boolean {
  if (now.kind === 'deny') return true;
  if (now.kind === 'allow_without_review') return false;
  if (then.kind !== 'require') return true;
  if (now.approvers > then.approvers) return true;
  const widerOrSame = (n?: string[], t?: string[]) => !n || (!!t && t.every((x) => n.includes(x)));
  if (now.roles && !then.roles && !then.users) return true;
  if (now.users && !then.users && !then.roles) return true;
  if ((now.roles && then.users) || (now.users && then.roles)) return true;
  return !(widerOrSame(now.roles, then.roles) && widerOrSame(now.users, then.users));
}
