/**
 * `countersign serve` with a fault injected, as a child process of a test (spawnServer's `crashAt`):
 * the same start-up as the CLI's, plus the hook that production wiring never passes.
 */
import { startHttpServer } from '../../src/app/serve-http.ts';
import { loadConfig } from '../../src/config.ts';
import type { FaultPoint } from '../../src/core/faults.ts';
import { createLogger } from '../../src/log.ts';
import { crashAt } from './faults.ts';

const point = process.env.TEST_CRASH_AT as FaultPoint;
const config = loadConfig(process.env, process.cwd());
const server = await startHttpServer(config, createLogger(config.log_level), { faults: crashAt(point) });
process.once('SIGTERM', () => void server.close().then(() => process.exit(0)));
