/** Approval rules: who must countersign a write, decided from what is written (docs/policy.md). */
export {
  asksMore,
  compilePolicy,
  requirementOf,
  type CompiledPolicy,
  type Decision,
  type Requirement,
} from './compile.ts';
export { inputOf, normalizedText, type RuleInput, type WriteFacts } from './input.ts';
export {
  INLINE_COST,
  RULE_BUDGET,
  type Budget,
  type PatternOptions,
  type PatternRunner,
} from './patterns.ts';
export { createPatternPool, PatternRunFailed, type PatternPool } from './pattern-pool.ts';
export { PolicyDoc, Rule, versionOf } from '../../core/approval-policy.ts';
export { createPolicySource, POLICY_UNCHANGED_SQL, type HeldPolicy, type PolicySource } from './store.ts';
export { sealUnsealedPolicy } from './seal.ts';
