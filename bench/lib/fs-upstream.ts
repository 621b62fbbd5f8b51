import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT } from './server.ts';

/** The reference filesystem MCP server (a dev dependency), run with `node FS_SERVER <root>`. */
export const FS_SERVER = path.join(
  ROOT,
  'node_modules/@modelcontextprotocol/server-filesystem/dist/index.js',
);

const LINE = 'countersign bench: one KiB read through a gateway.\n';
/** The file proxied reads fetch: exactly 1 KiB of text. */
export const ONE_KIB = LINE.repeat(Math.ceil(1024 / LINE.length)).slice(0, 1024);

export interface FsUpstream {
  /** The filesystem server's root, holding `file`. */
  root: string;
  /** The 1 KiB file (ONE_KIB), as an absolute path inside `root`. */
  file: string;
  /** A countersign config file with the filesystem server as upstream `name` (its tools: `<name>__…`). */
  config: string;
  name: string;
  dispose(): void;
}

/** A scratch directory: the filesystem server's root with the 1 KiB file, and countersign's config for it. */
export function fsUpstream(label: string, name = 'fs'): FsUpstream {
  // realpath: the filesystem server compares paths after resolving symlinks (a /tmp link would refuse).
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), `countersign-${label}-`)));
  const root = path.join(dir, 'root');
  fs.mkdirSync(root);
  const file = path.join(root, 'one-kib.txt');
  fs.writeFileSync(file, ONE_KIB);
  const config = path.join(dir, 'config.json');
  const upstream = { name, command: process.execPath, args: [FS_SERVER, root] };
  fs.writeFileSync(config, JSON.stringify({ upstreams: [upstream] }));
  return { root, file, config, name, dispose: () => fs.rmSync(dir, { recursive: true, force: true }) };
}
