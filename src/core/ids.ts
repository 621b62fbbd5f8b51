import { randomFillSync } from 'node:crypto';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Whether `value` has the form of a UUID: checked before a lookup, so a malformed id is "not found". */
export const isUuid = (value: unknown): value is string => typeof value === 'string' && UUID.test(value);

/**
 * Random bytes drawn from the operating system 4 KiB at a time: one system call per 256 trace ids
 * instead of one per call (each costs tens of microseconds on a busy virtual machine). The bytes are
 * the same CSPRNG output, each handed out once.
 */
const pool = Buffer.alloc(4096);
let offset = pool.length;

/** A call's trace id: 128 random bits in hex, as W3C trace context writes them. */
export function newTraceId(): string {
  if (offset + 16 > pool.length) {
    randomFillSync(pool);
    offset = 0;
  }
  offset += 16;
  return pool.toString('hex', offset - 16, offset);
}
