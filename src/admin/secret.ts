import { AppError } from '../core/errors.ts';

/**
 * Reads one line from a terminal without echoing it: the terminal is put in raw mode, so each key
 * arrives here instead of being printed, and backspace is handled by hand. Ctrl-C is an INTERRUPTED
 * refusal: in raw mode it no longer stops the process by itself.
 */
export function readHiddenLine(input: NodeJS.ReadStream, output: NodeJS.WritableStream): Promise<string> {
  return new Promise((resolve, reject) => {
    let line = '';
    const finish = (e?: Error) => {
      input.off('data', onData);
      input.setRawMode(false);
      input.pause();
      output.write('\n');
      if (e) reject(e);
      else resolve(line);
    };
    const onData = (chunk: Buffer | string) => {
      for (const ch of String(chunk)) {
        if (ch === '\r' || ch === '\n' || ch === '\u0004') return finish();
        if (ch === '\u0003') return finish(new AppError('INTERRUPTED', 'password entry interrupted'));
        if (ch === '\u007f' || ch === '\b') line = line.slice(0, -1);
        else line += ch;
      }
    };
    input.setRawMode(true);
    input.on('data', onData);
    input.resume();
  });
}
