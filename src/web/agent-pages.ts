import type { Response, Router } from 'express';
import { z } from 'zod';
import { loadProfiles } from '../core/profiles.ts';
import {
  formOf,
  listUsers,
  noticeOf,
  pathOf,
  runAs,
  showSecret,
  textOf,
  type AccountPages,
  type Refusal,
} from './account-kit.ts';

const AgentList = z.object({
  agents: z.array(
    z.object({
      id: z.string(),
      name: z.string(),
      profile: z.string(),
      owner: z.string().nullable(),
      owner_unresolved: z.string().nullable(),
      rate_limit_per_min: z.number().nullable(),
      created_at: z.string(),
      revoked_at: z.string().nullable(),
    }),
  ),
});
const Token = z.object({ token: z.string() });

const AGENT_NOTICES = {
  settings: 'Saved. It holds from the agent’s next call.',
  unchanged: 'Nothing to change.',
  revoked: 'Agent revoked: its token is refused from now on.',
};

/**
 * The rate-limit field as the command takes it: empty is the configured default (null), a number is a
 * number, and anything else goes to the command as typed, to be refused there like any bad input.
 */
function rateLimitOf(value: unknown): unknown {
  const text = textOf(value);
  if (text === '') return null;
  return Number.isFinite(Number(text)) ? Number(text) : text;
}

/** The pages' views of agents: the list, one agent, a token shown once. */
function agentViews(pages: AccountPages) {
  const { kit, run, config } = pages;
  const agentsOf = async () => AgentList.parse(await run({ command: 'agent.list' })).agents;
  const common = () => ({
    profiles: [...loadProfiles(config.policy.profiles_dir).values()],
    defaultRate: config.policy.rate_limit_per_min,
  });
  const showAgent = async (
    res: Response,
    name: string,
    status: number,
    extra: Record<string, unknown> = {},
  ) => {
    const agent = (await agentsOf()).find((a) => a.name === name);
    if (!agent)
      return kit.render(res, 404, 'error.njk', { title: 'Not found', message: `There is no agent ${name}.` });
    kit.render(res, status, 'agent.njk', { agent, ...common(), ...extra });
  };
  return {
    agentsOf,
    showAgent,
    async showList(res: Response, status: number, extra: Record<string, unknown> = {}) {
      const [agents, users] = await Promise.all([agentsOf(), listUsers(run)]);
      const owners = users.filter((u) => !u.disabled_at).map((u) => u.name);
      kit.render(res, status, 'agents.njk', { agents, owners, draft: {}, ...common(), ...extra });
    },
    refusedOn: (res: Response, name: string) => (r: Refusal) =>
      showAgent(res, name, r.status, { error: r.message }),
    tokenPage(res: Response, name: string, token: string, title: string, advice = '') {
      showSecret(pages, res, {
        title,
        label: `Token of agent ${name}`,
        secret: token,
        advice: [advice, 'Configure the agent’s MCP client with it as its bearer token.'].join(' ').trim(),
        back: { href: pathOf('agents', name), text: `${name}’s page` },
      });
    },
  };
}

/** The agents: list, add (token shown once), and each agent's page: profile, rate limit, rotate, revoke. */
export function mountAgentPages(router: Router, pages: AccountPages): void {
  const views = agentViews(pages);
  mountAgentList(router, pages, views);
  mountAgentPage(router, pages, views);
}

type AgentViews = ReturnType<typeof agentViews>;

function mountAgentList(router: Router, pages: AccountPages, { showList, tokenPage }: AgentViews): void {
  router.get('/admin/agents', ...pages.guard, (_req, res) => showList(res, 200));

  router.post('/admin/agents', ...pages.form, async (req, res) => {
    const body = formOf(req);
    const draft = {
      name: textOf(body.name),
      profile: textOf(body.profile) || undefined,
      owner: textOf(body.owner) || undefined,
      rate_limit_per_min: rateLimitOf(body.rate_limit_per_min) ?? undefined,
    };
    const added = await runAs(pages, res, { command: 'agent.add', ...draft }, ({ status, message }) =>
      showList(res, status, {
        error: message,
        draft: { ...draft, rate_limit_per_min: body.rate_limit_per_min },
      }),
    );
    if (added) tokenPage(res, draft.name, Token.parse(added).token, `Agent ${draft.name} added`);
  });
}

function mountAgentPage(router: Router, pages: AccountPages, views: AgentViews): void {
  const { agentsOf, showAgent, refusedOn, tokenPage } = views;

  router.get('/admin/agents/:name', ...pages.guard, (req, res) =>
    showAgent(res, String(req.params.name), 200, { notice: noticeOf(AGENT_NOTICES, req.query.done) }),
  );

  router.post('/admin/agents/:name/settings', ...pages.form, async (req, res) => {
    const name = String(req.params.name);
    const body = formOf(req);
    const change = {
      profile: textOf(body.profile) || undefined,
      rate_limit_per_min: rateLimitOf(body.rate_limit_per_min),
    };
    const agent = (await agentsOf()).find((a) => a.name === name);
    const same =
      agent && agent.profile === change.profile && agent.rate_limit_per_min === change.rate_limit_per_min;
    if (same) return res.redirect(303, `${pathOf('agents', name)}?done=unchanged`);
    if (await runAs(pages, res, { command: 'agent.set', name, ...change }, refusedOn(res, name)))
      res.redirect(303, `${pathOf('agents', name)}?done=settings`);
  });

  router.post('/admin/agents/:name/rotate', ...pages.form, async (req, res) => {
    const name = String(req.params.name);
    const rotated = await runAs(pages, res, { command: 'agent.rotate', name }, refusedOn(res, name));
    if (rotated)
      tokenPage(
        res,
        name,
        Token.parse(rotated).token,
        `New token for ${name}`,
        'The old token is refused from now on.',
      );
  });

  router.post('/admin/agents/:name/revoke', ...pages.form, async (req, res) => {
    const name = String(req.params.name);
    if (await runAs(pages, res, { command: 'agent.revoke', name }, refusedOn(res, name)))
      res.redirect(303, `${pathOf('agents', name)}?done=revoked`);
  });
}
