import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import pg from 'pg';
import { InMemoryServerEventBus, type ServerEvent, type ServerEventBus } from '@modelcontextprotocol/server';
import type { Logger } from '../log.ts';

/** The PostgreSQL channel replicas exchange change events on. */
export const EVENTS_CHANNEL = 'countersign_events';
/** The channel a trigger on `agents` announces every changed agent's id on (a migration creates it). */
export const AGENTS_CHANNEL = 'countersign_agents';
/** The channel a trigger announces the id of every task whose state may have changed on (a migration). */
export const TASKS_CHANNEL = 'countersign_tasks';

/** What the bus carries between replicas: the event, and which replica published it. */
interface Envelope {
  origin: string;
  event: ServerEvent;
}

export interface ClusterBus extends ServerEventBus {
  /** Calls `listener` for every event another replica published (not for this replica's own). */
  onForeign(listener: (event: ServerEvent) => void): () => void;
  /**
   * Calls `listener` with the id of every agent that changed, on any replica or by any command, and
   * with '*' when changes may have been missed (the listening connection was lost).
   */
  onAgentChanged(listener: (agentId: string) => void): () => void;
  /**
   * Tells this replica's listeners at once that an agent changed here (a command this process just
   * committed), without waiting for PostgreSQL to echo the trigger's notification back.
   */
  agentChangedHere(agentId: string): void;
  /**
   * Calls `listener` with the id of every task whose state may have changed (its request decided,
   * executed, expired or withdrawn, or the task settled), on any replica or by any command, and with
   * '*' when changes may have been missed. PostgreSQL only; on the embedded database nothing is
   * announced and the listen streams read their tasks again each poll interval.
   */
  onTaskChanged(listener: (taskId: string) => void): () => void;
  /** Whether change announcements reach this replica right now (the listening connection is up). */
  listening(): boolean;
  /**
   * Whether every change to an agent reaches onAgentChanged right now: on PostgreSQL while listening
   * (the `agents` trigger announces changes made anywhere, SQL included); on the embedded database
   * always, since its files are this process's alone while it runs (the data directory's lock: a
   * command run meanwhile is sent to this process, whose commands say so through agentChangedHere).
   */
  agentChangesAnnounced(): boolean;
  close(): Promise<void>;
}

/** The changing side of one replica's bus; the functions below deliver, listen and reconnect. */
interface PgBusState {
  readonly url: string;
  readonly log: Logger;
  /** This replica's id, to tell its own events from those of others. */
  readonly origin: string;
  readonly local: InMemoryServerEventBus;
  readonly foreign: Set<(event: ServerEvent) => void>;
  readonly agentListeners: Set<(agentId: string) => void>;
  readonly taskListeners: Set<(taskId: string) => void>;
  listener: pg.Client | undefined;
  closed: boolean;
  retry: NodeJS.Timeout | undefined;
  attempt: number;
}

/** Tells this replica's listeners that `agentId` changed ('*': any may have). */
function agentChanged(bus: PgBusState, agentId: string) {
  for (const l of bus.agentListeners) l(agentId);
}

/** Tells this replica's listeners that task `taskId` may have changed ('*': any may have). */
function taskChanged(bus: PgBusState, taskId: string) {
  for (const l of bus.taskListeners) l(taskId);
}

function deliver(bus: PgBusState, msg: pg.Notification) {
  if (msg.channel === AGENTS_CHANNEL) return agentChanged(bus, msg.payload ?? '*');
  if (msg.channel === TASKS_CHANNEL) return taskChanged(bus, msg.payload ?? '*');
  let envelope: Envelope;
  try {
    envelope = JSON.parse(msg.payload ?? '') as Envelope;
  } catch {
    return;
  }
  bus.local.publish(envelope.event);
  if (envelope.origin !== bus.origin) for (const l of bus.foreign) l(envelope.event);
}

function connectionLost(bus: PgBusState, client: pg.Client, err: Error) {
  bus.log.warn({ err: err.message }, 'event bus listener lost its connection; reconnecting');
  if (bus.listener === client) bus.listener = undefined;
  agentChanged(bus, '*');
  taskChanged(bus, '*');
  void client.end().catch(() => undefined);
  schedule(bus);
}

async function listen(bus: PgBusState): Promise<void> {
  const client = new pg.Client({ connectionString: bus.url, keepAlive: true });
  client.on('notification', (msg) => deliver(bus, msg));
  client.on('error', (err) => connectionLost(bus, client, err));
  await client.connect();
  await client.query(`listen ${EVENTS_CHANNEL}`);
  await client.query(`listen ${AGENTS_CHANNEL}`);
  await client.query(`listen ${TASKS_CHANNEL}`);
  if (bus.closed) {
    await client.end();
    return;
  }
  const reconnected = bus.attempt > 0;
  bus.listener = client;
  bus.attempt = 0;
  if (reconnected) {
    // What was published while we were away is lost: every listener lists again.
    bus.local.publish({ kind: 'tools_list_changed' });
    for (const l of bus.foreign) l({ kind: 'tools_list_changed' });
    taskChanged(bus, '*');
  }
}

function schedule(bus: PgBusState) {
  if (bus.closed || bus.retry) return;
  const delay = Math.min(10_000, 100 * 2 ** bus.attempt++);
  bus.retry = setTimeout(() => {
    bus.retry = undefined;
    listen(bus).catch(() => schedule(bus));
  }, delay);
  bus.retry.unref();
}

/**
 * Tells every replica that tool lists may have changed (an operator accepted an upstream tool's new
 * class), from any process on the database: sent when `q`'s transaction commits, and each replica lists
 * its upstreams again. PostgreSQL only; the embedded database has one process, told directly.
 */
export async function announceToolsChanged(q: Knex | Knex.Transaction, origin: string): Promise<void> {
  const payload: Envelope = { origin, event: { kind: 'tools_list_changed' } };
  await q.raw('select pg_notify(?, ?)', [EVENTS_CHANNEL, JSON.stringify(payload)]);
}

/**
 * The change-event bus that `subscriptions/listen` streams read from, shared by every replica through
 * PostgreSQL LISTEN/NOTIFY: an event published on one replica is delivered to the open listen streams of
 * all (this one included, when its own NOTIFY comes back). A dedicated connection listens; if it drops,
 * it reconnects with backoff, and the events NOTIFY sent meanwhile are lost — they only say "list again",
 * and a reconnect is followed by one such event so that nothing stays stale.
 */
export async function createPgBus(knex: Knex, url: string, log: Logger): Promise<ClusterBus> {
  const bus: PgBusState = {
    url,
    log,
    origin: randomUUID(),
    local: new InMemoryServerEventBus((err) => log.warn({ err }, 'change-event listener failed')),
    foreign: new Set(),
    agentListeners: new Set(),
    taskListeners: new Set(),
    listener: undefined,
    closed: false,
    retry: undefined,
    attempt: 0,
  };
  await listen(bus);

  return {
    publish(event) {
      const payload: Envelope = { origin: bus.origin, event };
      // Sent on the ordinary pool: only LISTEN needs a connection of its own.
      knex
        .raw('select pg_notify(?, ?)', [EVENTS_CHANNEL, JSON.stringify(payload)])
        .catch((err: Error) => log.warn({ err: err.message }, 'could not publish a change event'));
    },
    subscribe: (l) => bus.local.subscribe(l),
    onForeign(l) {
      bus.foreign.add(l);
      return () => bus.foreign.delete(l);
    },
    onAgentChanged(l) {
      bus.agentListeners.add(l);
      return () => bus.agentListeners.delete(l);
    },
    agentChangedHere: (id) => agentChanged(bus, id),
    onTaskChanged(l) {
      bus.taskListeners.add(l);
      return () => bus.taskListeners.delete(l);
    },
    listening: () => bus.listener !== undefined,
    agentChangesAnnounced: () => bus.listener !== undefined,
    async close() {
      bus.closed = true;
      clearTimeout(bus.retry);
      const open = bus.listener;
      bus.listener = undefined;
      await open?.end().catch(() => undefined);
    },
  };
}

/** One process (PGlite): the bus is the SDK's in-process one; nothing is foreign. */
export function createLocalBus(log: Logger): ClusterBus {
  const local = new InMemoryServerEventBus((err) => log.warn({ err }, 'change-event listener failed'));
  const agentListeners = new Set<(agentId: string) => void>();
  return {
    publish: (event) => local.publish(event),
    subscribe: (l) => local.subscribe(l),
    onForeign: () => () => undefined,
    // Every agent change is made by this process's commands, which say so (agentChangedHere).
    onAgentChanged(l) {
      agentListeners.add(l);
      return () => agentListeners.delete(l);
    },
    agentChangedHere: (id) => {
      for (const l of agentListeners) l(id);
    },
    // Nothing announces task changes here: listen streams read their tasks again each poll interval.
    onTaskChanged: () => () => undefined,
    // Task changes are not announced here, so nothing that waits on them may count on announcements.
    listening: () => false,
    // Agent changes are: no other process can open the embedded database while this one holds it.
    agentChangesAnnounced: () => true,
    async close() {},
  };
}
