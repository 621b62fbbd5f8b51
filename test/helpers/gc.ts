import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

// A full collection on demand without a command-line flag: the tests run under the README's npm test.
setFlagsFromString('--expose-gc');
/** Runs a full garbage collection. */
export const gc = runInNewContext('gc') as () => void;
