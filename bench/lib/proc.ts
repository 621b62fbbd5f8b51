import fs from 'node:fs';
import os from 'node:os';

/** A field of /proc/<pid>/status in MB (VmHWM: peak resident set, VmRSS: current). Linux only. */
export function statusMb(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

/** CPU seconds (user + system) a process has used so far. Linux only. */
export function cpuSeconds(pid: number): number {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // utime and stime are fields 14 and 15 of stat; here, after "pid (comm) ", at 11 and 12.
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return Number.NaN;
  }
}

/**
 * CPU seconds a process's threads have run so far, to the nanosecond (the sum of each thread's
 * /proc/<pid>/task/<tid>/schedstat): fine enough for a few milliseconds a second, which the clock
 * ticks of cpuSeconds are not. A thread that ended is no longer counted. Linux only.
 */
export function cpuSecondsFine(pid: number): number {
  try {
    return (
      fs
        .readdirSync(`/proc/${pid}/task`)
        .map((tid) => Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]))
        .reduce((a, b) => a + b, 0) / 1e9
    );
  } catch {
    return Number.NaN;
  }
}

export function machine(postgres: string) {
  return {
    cpus: os.cpus().length,
    cpu_model: os.cpus()[0]?.model ?? 'unknown',
    memory_mb: Math.round(os.totalmem() / 2 ** 20),
    node: process.version,
    postgres,
    platform: `${os.platform()} ${os.release()}`,
  };
}

/** `pid` and every process descended from it (children, grandchildren …), from /proc. Linux only. */
export function processTree(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      // The parent pid is the second field after "pid (comm) "; comm may itself hold spaces and parentheses.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // the process exited while the list was read
    }
  }
  const tree: number[] = [];
  for (const queue = [pid]; queue.length > 0;) {
    const next = queue.shift()!;
    tree.push(next);
    queue.push(...(children.get(next) ?? []));
  }
  return tree;
}

/**
 * A field of /proc/<pid>/status summed over `pid`'s process tree, in MB. Summing VmHWM adds each
 * process's own peak, so it bounds the tree's simultaneous peak from above.
 */
export function treeStatusMb(pid: number, field: 'VmHWM' | 'VmRSS'): { mb: number; processes: number } {
  const values = processTree(pid)
    .map((p) => statusMb(p, field))
    .filter((v) => Number.isFinite(v));
  return { mb: values.reduce((s, v) => s + v, 0), processes: values.length };
}
