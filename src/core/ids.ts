import { randomBytes } from 'node:crypto';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Whether `value` has the form of a UUID: checked before a lookup, so a malformed id is "not found". */
export const isUuid = (value: unknown): value is string => typeof value === 'string' && UUID.test(value);

/** A call's trace id: 128 random bits in hex, as W3C trace context writes them. */
export const newTraceId = (): string => randomBytes(16).toString('hex');
