import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { freePort } from '../lib/gateway-process.ts';

const run = promisify(execFile);

/**
 * A PostgreSQL cluster of the drill's own, in a scratch directory on a free port: the machine's
 * server is never stopped or restarted, whatever the drill does to this one. Built with the machine's
 * PostgreSQL binaries (Debian's /usr/lib/postgresql/N/bin, or PG_BIN); as root, it runs as the
 * `postgres` user, since PostgreSQL refuses to run as root.
 */
export interface PgCluster {
  /** postgres://postgres@127.0.0.1:PORT/postgres: the cluster's admin URL. */
  adminUrl: string;
  port: number;
  /** `pg_ctl stop -m immediate`: every backend killed at once, no checkpoint (a crash, as far as clients see). */
  stopImmediate(): Promise<void>;
  /** `pg_ctl stop -m fast`: connections closed, a clean shutdown. */
  stopFast(): Promise<void>;
  /** Starts it again and waits until it accepts connections (crash recovery first, after an immediate stop). */
  start(): Promise<void>;
  /** Stops it (immediate) and removes its directory. */
  dispose(): Promise<void>;
  /** Its processes now: the postmaster (whose later backends inherit its CPU affinity) and its children. */
  pids(): number[];
}

function pgBin(): string {
  if (process.env.PG_BIN) return process.env.PG_BIN;
  const root = '/usr/lib/postgresql';
  const versions = fs.existsSync(root)
    ? fs
        .readdirSync(root)
        .filter((v) => fs.existsSync(path.join(root, v, 'bin/pg_ctl')))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (versions.length === 0)
    throw new Error('no PostgreSQL binaries in /usr/lib/postgresql/*/bin: install postgresql, or set PG_BIN');
  return path.join(root, versions[0]!, 'bin');
}

export async function startPgCluster(label: string): Promise<PgCluster> {
  const bin = pgBin();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `countersign-drill-pg-${label}-`));
  const data = path.join(dir, 'data');
  const logFile = path.join(dir, 'server.log');
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const { stdout } = await run('id', ['-u', 'postgres']);
    const uid = Number(stdout.trim());
    const gid = Number((await run('id', ['-g', 'postgres'])).stdout.trim());
    fs.chownSync(dir, uid, gid);
  }
  const pg = (tool: string, args: string[]) =>
    asRoot
      ? run('runuser', ['-u', 'postgres', '--', path.join(bin, tool), ...args], { cwd: dir })
      : run(path.join(bin, tool), args, { cwd: dir });
  const port = await freePort();

  await pg('initdb', [
    '-D',
    data,
    '-A',
    'trust',
    '-U',
    'postgres',
    '-E',
    'UTF8',
    '--no-sync',
    '--no-instructions',
  ]);
  // Its socket in its own directory, TCP on loopback only; room for three replicas' pools and the checks.
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c max_connections=200`;
  const start = async () => {
    await pg('pg_ctl', ['-D', data, '-l', logFile, '-o', options, '-w', '-t', '120', 'start']);
  };
  const stop = async (mode: 'immediate' | 'fast') => {
    await pg('pg_ctl', ['-D', data, '-m', mode, '-w', '-t', '60', 'stop']);
  };
  await start();
  return {
    adminUrl: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    stopImmediate: () => stop('immediate'),
    stopFast: () => stop('fast'),
    start,
    pids() {
      const postmaster = Number(fs.readFileSync(path.join(data, 'postmaster.pid'), 'utf8').split('\n', 1)[0]);
      const children = fs
        .readdirSync('/proc')
        .filter((d) => /^\d+$/.test(d))
        .filter((d) => {
          try {
            return (
              Number(fs.readFileSync(`/proc/${d}/stat`, 'utf8').split(') ')[1]!.split(' ')[1]) === postmaster
            );
          } catch {
            return false;
          }
        })
        .map(Number);
      return [postmaster, ...children];
    },
    async dispose() {
      await stop('immediate').catch(() => undefined);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
