// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import fs from 'node:fs';

/** Where statements are built: the db floor and the store modules (scripts/store-modules.json). */
const storeModules = JSON.parse(
  fs.readFileSync(new URL('./scripts/store-modules.json', import.meta.url), 'utf8'),
);

export default tseslint.config(
  { ignores: ['dist/', 'data/', 'node_modules/', 'test-results/', 'bench/results/'] },
  js.configs.recommended,
  ...tseslint.configs.strict,
  {
    languageOptions: { globals: { process: 'readonly', console: 'readonly', URL: 'readonly' } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-dynamic-delete': 'off',
    },
  },
  {
    files: ['**/*.cjs'],
    languageOptions: { sourceType: 'commonjs', globals: { module: 'writable', require: 'readonly' } },
  },
  // stdout is the MCP channel under stdio: nothing in src/ may print with console.
  { files: ['src/**/*.ts'], rules: { 'no-console': 'error' } },
  // A function a newcomer cannot read in one sitting is several functions (docs/design.md).
  {
    files: ['src/**/*.ts'],
    rules: { 'max-lines-per-function': ['error', { max: 80, skipBlankLines: true, skipComments: true }] },
  },
  // SQL lives in store modules: only they and db/ import knex, types included (CONTRIBUTING.md, "A new table", and docs/design.md, "Tables and their stores").
  {
    files: ['src/**/*.ts'],
    ignores: storeModules.stores,
    rules: {
      'no-restricted-imports': [
        'error',
        {
          paths: [
            {
              name: 'knex',
              message:
                "statements belong in the owner's store module (a store/ folder or a *store.ts file); pass a Queryable or Transaction from src/db/knex.ts",
            },
          ],
        },
      ],
    },
  },
);
