import { z } from 'zod';

/** Who acts: agents call tools with a bearer token; users (people) sign in to decide and review. */

export interface Agent {
  id: string;
  name: string;
  profile: string;
  /** The user who owns the agent and so may not decide its requests; null: no owner. */
  owner_id: string | null;
  /** Calls per minute; null: the configured default. */
  rate_limit_per_min: number | null;
}

export const AgentName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, 'letters, digits, dot, dash and underscore, at most 64');

export const Role = z.enum(['chair', 'compliance', 'admin']);
export type Role = z.infer<typeof Role>;

export const UserName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/, 'letters, digits, dot, dash, @ and underscore, at most 64');

export interface User {
  id: string;
  name: string;
  roles: Role[];
}
