import fs from 'node:fs';
import { SourceMap, type SourceMapPayload } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Stack traces that name the TypeScript sources, for the built server (dist/), read only when a stack
 * is printed. `npm start` runs without `--enable-source-maps`: with it Node reads and keeps the source
 * map of every module that names one at load, the dependencies' included (the MCP SDK's, OpenTelemetry's
 * … several megabytes of JSON, sources and all), about 20 MB of the server's memory for as long as it
 * runs (docs/performance.md). Only countersign's own frames are mapped here, by the map esbuild writes
 * beside each file of dist/; a frame of a dependency, of Node or of the sources under tsx is left as
 * it is, and so is the whole stack when no map can be read.
 */

/** Per built file, its map (null: none to be had), read on its first frame. */
const maps = new Map<string, SourceMap | null>();

function mapOf(file: string): SourceMap | null {
  let map = maps.get(file);
  if (map !== undefined) return map;
  try {
    map = new SourceMap(JSON.parse(fs.readFileSync(`${file}.map`, 'utf8')) as SourceMapPayload);
  } catch {
    map = null;
  }
  maps.set(file, map);
  return map;
}

/** `file:///…/dist/x.js` or `/…/dist/x.js`, with its line and column (1-based), in a stack frame. */
const FRAME = /((?:file:\/\/)?(\/[^\s():]*\/dist\/[^\s():]+\.js)):(\d+):(\d+)/;

/** One frame's location in the sources, or the frame as it was. */
function mapFrame(line: string): string {
  const m = FRAME.exec(line);
  if (!m) return line;
  const [whole, location, file, row, column] = m as unknown as [string, string, string, string, string];
  const filePath = location.startsWith('file://') ? fileURLToPath(location) : file;
  const map = mapOf(filePath);
  const entry = map?.findEntry(Number(row) - 1, Number(column) - 1);
  if (!entry || !('originalSource' in entry) || !entry.originalSource) return line;
  const source = entry.originalSource.startsWith('file://')
    ? fileURLToPath(entry.originalSource)
    : path.resolve(path.dirname(filePath), entry.originalSource);
  return line.replace(whole, `${source}:${entry.originalLine + 1}:${entry.originalColumn + 1}`);
}

/** `stack` with each frame of the built server moved to its place in the sources. */
export function sourceStack(stack: string): string {
  if (!stack.includes('/dist/')) return stack;
  return stack.split('\n').map(mapFrame).join('\n');
}
