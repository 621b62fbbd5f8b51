import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { figure, type Figure } from '../lib/report.ts';
import { callTool, connect, spawnCountersign } from '../lib/server.ts';
import { median } from '../lib/stats.ts';

export interface WarmStartOptions {
  starts: number;
  log(line: string): void;
}

/**
 * (f) from `countersign serve` being started on an initialised embedded database (PGlite) to the
 * answer of its first tools/call — what an agent waits for after a restart.
 */
export async function warmStartFigures(o: WarmStartOptions): Promise<Figure[]> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-bench-warm-'));
  const env = { COUNTERSIGN_DATA_DIR: dataDir, COUNTERSIGN_DEMO: 'true' };
  try {
    // The first start creates the database, the demo data and an agent: not measured.
    const first = await spawnCountersign(env);
    const token = (await first.waitFor(/demo agent token \(shown once\): (\S+)/))[1]!;
    await first.stop();

    const toCall: number[] = [];
    const toListen: number[] = [];
    for (let i = 0; i < o.starts; i++) {
      const t0 = performance.now();
      const server = await spawnCountersign(env);
      toListen.push(performance.now() - t0);
      try {
        const client = await connect(server.url, token);
        const { envelope } = await callTool(client, 'isphere_search_contacts', { query: 'alice' });
        if (envelope.ok !== true) throw new Error(`first call failed: ${JSON.stringify(envelope)}`);
        toCall.push(performance.now() - t0);
        await client.close();
      } finally {
        await server.stop();
      }
      o.log(
        `  start ${i + 1}: listening after ${(toListen.at(-1)! / 1000).toFixed(2)} s, first call answered after ${(toCall.at(-1)! / 1000).toFixed(2)} s`,
      );
    }
    return [
      figure({
        id: 'f_warm_start_s',
        unit: 's',
        value: median(toCall) / 1000,
        check: { valueAtMost: 3 },
        note: `median of ${o.starts}; listening after ${(median(toListen) / 1000).toFixed(2)} s`,
      }),
    ];
  } finally {
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}
