/**
 * node --import tsx bench/capped-read.ts [rounds] [--node-options="…"]
 *
 * What reading an upstream's oversized answer costs everyone else in the process: an upstream (a
 * child process, on a CPU of its own where `taskset` and two CPUs allow) answers every request with
 * a 64 MiB event-stream event, and this process reads six of them, two at a time, through the capped
 * fetch of src/core/fetch.ts (8 MiB, the default max_result_bytes), each refused at the cap. Per
 * round: how long the six took, this process's event-loop delay meanwhile (p99 and max, 1 ms
 * resolution: how long any other call would have waited) and its collections, full ones apart. A live
 * heap of about 70 MB stands in for the server's own. The reader runs with `npm start`'s node options
 * (package.json), as the server does: the heap's limit and growth decide how often reading 48 MiB of
 * answers brings on a full collection (docs/performance.md). `--node-options="…"` runs it with others.
 */
import { execFileSync, fork, spawn } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import {
  constants,
  monitorEventLoopDelay,
  PerformanceObserver,
  type PerformanceEntry,
} from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { cappedFetch } from '../src/core/fetch.ts';
import { startNodeArgs } from './lib/server.ts';
import { round } from './lib/stats.ts';

const ANSWER_BYTES = 64 * 1024 * 1024;
const CAP_BYTES = 8 * 1024 * 1024;

/** The upstream: one event of ANSWER_BYTES per request, written as fast as the reader takes it. */
function upstream() {
  const chunk = Buffer.alloc(64 * 1024, 'x');
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"');
    let sent = 0;
    const pump = () => {
      while (sent < ANSWER_BYTES) {
        sent += chunk.length;
        if (!res.write(chunk)) return void res.once('drain', pump);
      }
      res.end('"}]}}\n\n');
    };
    res.on('close', () => (sent = Infinity));
    pump();
  });
  server.listen(0, '127.0.0.1', () => process.send!((server.address() as AddressInfo).port));
}

const pin = (pid: number, cpu: number) => {
  try {
    execFileSync('taskset', ['-a', '-p', '-c', String(cpu), String(pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
};

/** This file again, in a process with npm start's node options (or those given), for the reading. */
function asTheServerRuns(): Promise<number> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { 'node-options': { type: 'string' } },
  });
  const options = values['node-options']?.split(/\s+/).filter(Boolean) ?? startNodeArgs();
  console.log(`reader's node options: ${options.join(' ') || '(none)'}`);
  const child = spawn(
    process.execPath,
    [...options, '--import', 'tsx', fileURLToPath(import.meta.url), 'reader', positionals[0] ?? '6'],
    { stdio: 'inherit' },
  );
  return new Promise((resolve) => child.once('exit', (code) => resolve(code ?? 1)));
}

async function main(rounds: number) {
  const child = fork(fileURLToPath(import.meta.url), ['upstream']);
  const port = await new Promise<number>((resolve) => child.once('message', (p) => resolve(Number(p))));
  const pinned = os.availableParallelism() >= 2 && pin(process.pid, 0) && pin(child.pid!, 1);
  const ballast = Array.from({ length: 400_000 }, (_, i) => ({ a: i, b: `k${i}`, c: [i, i + 1] }));
  const read = async () => {
    const res = await cappedFetch(CAP_BYTES)(`http://127.0.0.1:${port}/`, {
      method: 'POST',
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call' }),
    });
    const text = await res.text();
    if (!text.includes('countersign.result_too_large'))
      throw new Error('an answer past the cap was not refused');
  };
  await read(); // compiled code, connections
  const gcs: (PerformanceEntry & { detail?: { kind?: number } })[] = [];
  const observer = new PerformanceObserver((list) => gcs.push(...list.getEntries()));
  observer.observe({ entryTypes: ['gc'] });
  console.log(
    `six answers of 64 MiB, two at a time, capped at 8 MiB; ${pinned ? 'pinned: reader CPU 0, upstream CPU 1' : 'not pinned'}`,
  );
  const p99s: number[] = [];
  for (let r = 0; r < rounds; r++) {
    gcs.length = 0;
    const delay = monitorEventLoopDelay({ resolution: 1 });
    delay.enable();
    const t0 = performance.now();
    for (let i = 0; i < 3; i++) await Promise.all([read(), read()]);
    const ms = performance.now() - t0;
    delay.disable();
    const p99 = round(delay.percentile(99) / 1e6, 1);
    p99s.push(p99);
    console.log(
      `  round ${r + 1}: ${round(ms, 0)} ms; event loop delay p99 ${p99} ms, max ${round(delay.max / 1e6, 1)} ms; ` +
        `${gcs.length} collections (${gcs.filter((g) => g.detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR).length} full), ${round(
          gcs.reduce((sum, g) => sum + g.duration, 0),
          1,
        )} ms`,
    );
  }
  p99s.sort((a, b) => a - b);
  console.log(
    `  median p99 ${p99s[Math.floor(p99s.length / 2)]} ms (live heap ${ballast.length} objects kept)`,
  );
  observer.disconnect();
  child.kill();
}

if (process.argv[2] === 'upstream') upstream();
else if (process.argv[2] === 'reader') await main(Number(process.argv[3]));
else process.exitCode = await asTheServerRuns();
