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
export { RULE_BUDGET } from './patterns.ts';
export { PolicyDoc, Rule, versionOf } from '../../core/approval-policy.ts';
export { createPolicySource, POLICY_UNCHANGED_SQL, type HeldPolicy, type PolicySource } from './store.ts';
