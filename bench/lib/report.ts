import fs from 'node:fs';
import path from 'node:path';
import { round } from './stats.ts';

export interface Figure {
  id: string;
  unit: string;
  value: number;
  /** The same-run baseline this figure is compared with; null where docs/performance.md names none. */
  baseline: number | null;
  baseline_label: string | null;
  ratio: number | null;
  /** The target in docs/performance.md, as an expression over `value` and `ratio`; null for figures shown for context. */
  target: string | null;
  met: boolean | null;
  note?: string;
}

type Check =
  | { ratioAtLeast: number }
  | { ratioAtMost: number }
  | { valueAtMost: number }
  | { valueAtLeast: number }
  | null;

export function figure(f: {
  id: string;
  unit: string;
  value: number;
  baseline?: number | null;
  baseline_label?: string | null;
  /** Default: value / baseline. */
  ratio?: number | null;
  check: Check;
  note?: string;
}): Figure {
  const baseline = f.baseline ?? null;
  const ratio = f.ratio !== undefined ? f.ratio : baseline ? f.value / baseline : null;
  let target: string | null = null;
  let met: boolean | null = null;
  if (f.check && 'ratioAtLeast' in f.check) {
    target = `ratio >= ${f.check.ratioAtLeast}`;
    met = ratio !== null && ratio >= f.check.ratioAtLeast;
  } else if (f.check && 'ratioAtMost' in f.check) {
    target = `ratio <= ${f.check.ratioAtMost}`;
    met = ratio !== null && ratio <= f.check.ratioAtMost;
  } else if (f.check && 'valueAtMost' in f.check) {
    target = `value <= ${f.check.valueAtMost}`;
    met = f.value <= f.check.valueAtMost;
  } else if (f.check && 'valueAtLeast' in f.check) {
    target = `value >= ${f.check.valueAtLeast}`;
    met = f.value >= f.check.valueAtLeast;
  }
  return {
    id: f.id,
    unit: f.unit,
    value: round(f.value),
    baseline: baseline === null ? null : round(baseline),
    baseline_label: f.baseline_label ?? null,
    ratio: ratio === null ? null : round(ratio),
    target,
    met: Number.isFinite(f.value) ? met : false,
    ...(f.note ? { note: f.note } : {}),
  };
}

const cell = (v: unknown) => (v === null || v === undefined ? '-' : String(v));

export function table(figures: readonly Figure[]): string {
  const rows = [
    ['figure', 'unit', 'value', 'baseline', 'ratio', 'target', 'met'],
    ...figures.map((f) => [
      f.id,
      f.unit,
      cell(f.value),
      cell(f.baseline),
      cell(f.ratio),
      cell(f.target),
      f.met === null ? '-' : f.met ? 'yes' : 'NO',
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) => r.map((c, i) => c.padEnd(widths[i]!)).join('  ')).join('\n');
}

export function writeResults(file: string, body: unknown): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, `${JSON.stringify(body, null, 2)}\n`);
}
