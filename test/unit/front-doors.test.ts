import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { it } from 'node:test';
import ts from 'typescript';

/*
 * What each folder with a front door offers the rest of src/ is its index.ts's exports. They are
 * snapshotted (test/__snapshots__/front-doors.json), so that a change to a folder's public surface is a
 * reviewed diff. Regenerate with UPDATE_SNAPSHOTS=1 after a deliberate change.
 */

const SNAPSHOT = new URL('../__snapshots__/front-doors.json', import.meta.url);

/** The folders the lint holds to their front door (.dependency-cruiser.cjs). */
const folders = (): string[] =>
  (
    createRequire(import.meta.url)('../../.dependency-cruiser.cjs') as {
      forbidden: { name: string }[];
    }
  ).forbidden
    .map((rule) => /^front-door-(.+)$/.exec(rule.name)?.[1])
    .filter((folder): folder is string => folder !== undefined);

const hasExport = (node: ts.Node) =>
  ts.canHaveModifiers(node) &&
  (ts.getModifiers(node) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword);

/** The names a module exports, read from its source (values and types alike), sorted. */
function exportNames(path: URL): string[] {
  const source = ts.createSourceFile(path.pathname, readFileSync(path, 'utf8'), ts.ScriptTarget.Latest);
  const names: string[] = [];
  for (const node of source.statements) {
    if (ts.isExportDeclaration(node)) {
      assert.ok(
        node.exportClause && ts.isNamedExports(node.exportClause),
        `${path.pathname}: export * hides what the door offers; name each export`,
      );
      for (const spec of node.exportClause.elements) names.push(spec.name.text);
    } else if (hasExport(node)) {
      if (ts.isVariableStatement(node)) {
        for (const d of node.declarationList.declarations) names.push(d.name.getText(source));
      } else {
        const name = (node as ts.DeclarationStatement).name;
        assert.ok(name, `${path.pathname}: an export without a name`);
        names.push(name.getText(source));
      }
    }
  }
  return [...new Set(names)].sort();
}

it("snapshots every front door's exports", () => {
  const doors = folders();
  assert.deepEqual(
    [...doors].sort(),
    ['accounts', 'approval', 'audit', 'connectors', 'notify', 'server', 'tools'],
    'the folders with a front door',
  );
  const now = Object.fromEntries(
    [...doors]
      .sort()
      .map((folder) => [folder, exportNames(new URL(`../../src/${folder}/index.ts`, import.meta.url))]),
  );
  if (process.env.UPDATE_SNAPSHOTS === '1') writeFileSync(SNAPSHOT, `${JSON.stringify(now, null, 2)}\n`);
  const stored = JSON.parse(readFileSync(SNAPSHOT, 'utf8')) as Record<string, string[]>;
  for (const folder of Object.keys(now)) {
    assert.deepEqual(
      now[folder],
      stored[folder],
      `src/${folder}/index.ts exports (UPDATE_SNAPSHOTS=1 after review)`,
    );
  }
  assert.deepEqual(Object.keys(stored).sort(), Object.keys(now), 'the snapshotted folders');
});
