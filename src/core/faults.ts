/**
 * Points where a test may inject a fault: the process dying between the steps of an execution, or a
 * handler that is slow to start. Production wiring never provides a `Faults`; tests pass one to
 * `openServices` (test/helpers/faults.ts).
 */
export type FaultPoint =
  | 'before_handler'
  | 'after_write_started'
  | 'after_connector_write'
  /** Step 7 of a call, before its own tool.call row is appended (the write's rows are committed). */
  | 'before_call_row'
  /** Start-up, listening already, before the database is opened (the window answered 503 starting). */
  | 'before_database'
  /** Start-up, once the first run's credentials exist and before anything has shown them. */
  | 'after_first_run';

export interface Faults {
  at(point: FaultPoint): void | Promise<void>;
}
