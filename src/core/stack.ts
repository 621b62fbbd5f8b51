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
 * it is, and so is the whole stack when no map can be read. Only frame lines are read, and only files
 * of the build: an error's message (which a caller may have put words in) never makes it read a file.
 */

/** The build this module is part of: dist/ when built; under tsx src/core/, where no frame has a map. */
const OWN_BUILD = path.dirname(fileURLToPath(import.meta.url));

/** Per built file, its map (null: none to be had), read on its first frame: at most one per file of the build. */
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

/** A frame's line (`    at …`): its file (a path or a file: URL), line and column (1-based). */
const FRAME = /^\s+at .*?((?:file:\/\/)?\/[^\s():]+\.js):(\d+):(\d+)\)?$/;

/** One frame's location in the sources, or the line as it was (not a frame, not of the build, no map). */
function mapFrame(line: string, build: string): string {
  const m = FRAME.exec(line);
  if (!m) return line;
  const [, location, row, column] = m as unknown as [string, string, string, string];
  const file = path.resolve(location.startsWith('file://') ? fileURLToPath(location) : location);
  // Only the build's own files: a line can name any path (`..` too), and no other file is ever read.
  if (!file.startsWith(`${build}${path.sep}`)) return line;
  const entry = mapOf(file)?.findEntry(Number(row) - 1, Number(column) - 1);
  if (!entry || !('originalSource' in entry) || !entry.originalSource) return line;
  const source = entry.originalSource.startsWith('file://')
    ? fileURLToPath(entry.originalSource)
    : path.resolve(path.dirname(file), entry.originalSource);
  return line.replace(
    `${location}:${row}:${column}`,
    `${source}:${entry.originalLine + 1}:${entry.originalColumn + 1}`,
  );
}

/** `stack` with each frame of the build (`build`, this process's own by default) moved to its place in the sources. */
export function sourceStack(stack: string, build = OWN_BUILD): string {
  if (!stack.includes(build)) return stack;
  return stack
    .split('\n')
    .map((line) => mapFrame(line, build))
    .join('\n');
}
