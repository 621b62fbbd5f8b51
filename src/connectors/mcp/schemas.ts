import { Ajv2019 } from 'ajv/dist/2019.js';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { RE2JS } from 're2js';
import { Ajv, AjvJsonSchemaValidator, addFormats } from '@modelcontextprotocol/client/validators/ajv';
import type { JsonSchemaType, JsonSchemaValidator } from '@modelcontextprotocol/client';

/** What Ajv needs of a compiled pattern: `test`, and a `toString` it caches the pattern under. */
interface Tester {
  test(s: string): boolean;
  toString(): string;
}

/**
 * Compiles an upstream's `pattern` (and `patternProperties`) on RE2, which matches in time linear in
 * the input: an upstream's `^(a+)+$` cannot hold the event loop (JavaScript's backtracking engine took
 * 85 s on 34 characters). A pattern RE2 does not support (look-around, back-references) is not
 * evaluated here: it matches everything, and the upstream still checks its own input.
 */
function re2(pattern: string): Tester {
  // Ajv keys its cache of compiled patterns by toString: one per pattern, as a RegExp's would be.
  const toString = () => `re2:/${pattern}/`;
  let compiled: RE2JS;
  try {
    compiled = RE2JS.compile(pattern);
  } catch {
    return { test: () => true, toString };
  }
  return { test: (s) => compiled.matcher(s).find(), toString };
}
// Ajv's generated code names the engine by `code` only when it writes standalone modules (never here).
const regExp = Object.assign((pattern: string) => re2(pattern), { code: 're2' });

const options = {
  strict: false,
  validateFormats: true,
  validateSchema: false,
  allErrors: true,
  code: { regExp },
} as const;

/** An engine per dialect, as the SDK's own validator picks them, each matching patterns on RE2. */
function engine<E extends { addFormat: unknown }>(make: (opts: typeof options) => E) {
  let validator: AjvJsonSchemaValidator | undefined;
  return () => {
    if (!validator) {
      const ajv = make(options);
      addFormats(ajv as unknown as Parameters<typeof addFormats>[0]);
      validator = new AjvJsonSchemaValidator(
        ajv as unknown as ConstructorParameters<typeof AjvJsonSchemaValidator>[0],
      );
    }
    return validator;
  };
}

const draft2020 = engine((o) => new Ajv2020(o));
const draft2019 = engine((o) => new Ajv2019(o));
const draft07 = engine((o) => new Ajv(o));

/** The dialect a `$schema` names, http or https, with or without the trailing `#`. */
const dialectOf = (uri: string) => uri.replace(/^https?:\/\//, '').replace(/#$/, '');
const DIALECTS: Record<string, () => AjvJsonSchemaValidator> = {
  'json-schema.org/draft/2020-12/schema': draft2020,
  'json-schema.org/draft/2019-09/schema': draft2019,
  'json-schema.org/draft-07/schema': draft07,
  'json-schema.org/draft-06/schema': draft07,
};

/**
 * Compiles a JSON Schema an upstream sent (a tool's input or output schema) for the dialect it
 * declares, as the SDK's validator does (none: 2020-12), but with patterns matched on RE2. Throws for
 * a schema that does not compile or declares a dialect that is not supported.
 */
export function upstreamValidator<T = unknown>(schema: JsonSchemaType): JsonSchemaValidator<T> {
  const declared = (schema as { $schema?: unknown }).$schema;
  const pick = typeof declared === 'string' ? DIALECTS[dialectOf(declared)] : draft2020;
  if (!pick) throw new Error(`the JSON Schema dialect "${String(declared).slice(0, 200)}" is not supported`);
  return pick().getValidator<T>(schema);
}
