/**
 * npm run bench:ab -- --before <checkout> [--calls 1000] [--rounds 4]
 *
 * A/B of one figure's core, the sequential proxied read of (h): two countersign servers, one built from
 * `--before` (another checkout of this repository, with its node_modules) and one from this tree, each
 * with its own scratch database and filesystem upstream; one client each, their calls interleaved one by
 * one so that the machine's drift lands on both alike. Prints each round's p50 and the difference. On a
 * shared VM the full runs of `npm run bench` drift by more than a change of 100 µs; this does not.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { Client } from '@modelcontextprotocol/client';
import { createScratchDatabase, DEFAULT_ADMIN_URL } from './lib/database.ts';
import { fsUpstream } from './lib/fs-upstream.ts';
import { callTool, connect, untilAnswered } from './lib/server.ts';
import { median } from './lib/stats.ts';

const { values: flags } = parseArgs({
  options: {
    before: { type: 'string' },
    calls: { type: 'string', default: '1000' },
    rounds: { type: 'string', default: '4' },
  },
});
if (!flags.before) {
  process.stderr.write('usage: npm run bench:ab -- --before <another checkout> [--calls N] [--rounds N]\n');
  process.exit(2);
}
const before = path.resolve(flags.before);
const adminUrl = process.env.BENCH_DATABASE_URL || DEFAULT_ADMIN_URL;

type SpawnCountersign = typeof import('./lib/server.ts').spawnCountersign;
type SeedDatabase = typeof import('./lib/database.ts').seedDatabase;
interface Side {
  label: string;
  call(): Promise<void>;
}

const cleanups: (() => unknown)[] = [];

/** A countersign built from `root`'s tree, in front of its own filesystem upstream, with one client. */
async function side(label: string, root: string): Promise<Side> {
  const { spawnCountersign } = (await import(path.join(root, 'bench/lib/server.ts'))) as {
    spawnCountersign: SpawnCountersign;
  };
  // Each side seeds its database as its own code does: how an agent's token is stored is the code's.
  const { seedDatabase } = (await import(path.join(root, 'bench/lib/database.ts'))) as {
    seedDatabase: SeedDatabase;
  };
  const db = await createScratchDatabase(adminUrl, `ab_${label}`);
  cleanups.push(() => db.drop());
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), `countersign-ab-${label}-`));
  cleanups.push(() => fs.rmSync(dataDir, { recursive: true, force: true }));
  const ws = fsUpstream(`ab-${label}`);
  cleanups.push(() => ws.dispose());
  const seeded = await seedDatabase(db.url, dataDir);
  const cs = await spawnCountersign({
    DATABASE_URL: db.url,
    COUNTERSIGN_DATA_DIR: dataDir,
    COUNTERSIGN_CONFIG: ws.config,
  });
  cleanups.push(() => cs.stop());
  const client: Client = await connect(cs.url, seeded.token);
  cleanups.push(() => client.close());
  const tool = `${ws.name}__read_text_file`;
  /** The read, or what was wrong with its answer. */
  const read = async () => {
    const { envelope } = await callTool(client, tool, { path: ws.file });
    return envelope.ok === true ? undefined : JSON.stringify(envelope.error ?? envelope);
  };
  await untilAnswered(label, read);
  const call = async () => {
    const failed = await read();
    if (failed) throw new Error(`${label}: ${failed}`);
  };
  return { label, call };
}

try {
  const sides = [await side('before', before), await side('after', path.resolve(import.meta.dirname, '..'))];
  for (let i = 0; i < 300; i++) for (const s of sides) await s.call();
  const calls = Number(flags.calls);
  for (let round = 0; round < Number(flags.rounds); round++) {
    const samples = sides.map((): number[] => []);
    for (let k = 0; k < calls; k++) {
      for (let j = 0; j < sides.length; j++) {
        const i = (k + j) % sides.length;
        const t0 = performance.now();
        await sides[i]!.call();
        samples[i]!.push(performance.now() - t0);
      }
    }
    const [b, a] = samples.map(median) as [number, number];
    process.stdout.write(
      `round ${round + 1}: before ${b.toFixed(3)} ms, after ${a.toFixed(3)} ms, ` +
        `after − before ${((a - b) * 1000).toFixed(0)} µs (p50 of ${calls} sequential proxied reads each)\n`,
    );
  }
} finally {
  for (const cleanup of cleanups.reverse()) await Promise.resolve(cleanup()).catch(() => {});
}
