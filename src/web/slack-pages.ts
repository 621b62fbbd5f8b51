import express, { type Request, type RequestHandler, type Response } from 'express';
import { z } from 'zod';
import type { SlackConfig } from '../config.ts';
import { createSlackApi, NOTE_BLOCK, parseDecisionValue, REJECT_VIEW, rejectModal } from '../notify/index.ts';
import { sendProblem } from '../core/problem.ts';
import {
  admit,
  auditRefusal,
  countRefusal,
  decideFor,
  fail,
  Target,
  type Ctx,
  type SlackPageDeps,
} from './slack-decide.ts';
import { checkSignature, type SignatureCheck } from './slack-verify.ts';

export type { SlackPageDeps };

/** Slack wants an answer within 3 s: work still running after this is finished after the answer. */
const ANSWER_BUDGET_MS = 2500;
/** A Web API call made while Slack waits for the answer (views.open's trigger_id lives 3 s). */
const CALLBACK_CALL_MS = 2000;

const Action = z.object({ action_id: z.string(), value: z.string().optional() });
const SlackUser = z.object({ id: z.string().min(1) });
/** The two callbacks countersign asks for: a button clicked, the rejection modal submitted. */
const Payload = z.discriminatedUnion('type', [
  z.object({
    type: z.literal('block_actions'),
    user: SlackUser,
    trigger_id: z.string().min(1),
    response_url: z.url().optional(),
    actions: z.array(Action).min(1),
  }),
  z.object({
    type: z.literal('view_submission'),
    user: SlackUser,
    view: z.object({
      callback_id: z.literal(REJECT_VIEW),
      private_metadata: z.string(),
      state: z.object({
        values: z.record(z.string(), z.record(z.string(), z.object({ value: z.string().nullish() }))),
      }),
    }),
  }),
]);
type Payload = z.infer<typeof Payload>;
type BlockActions = Extract<Payload, { type: 'block_actions' }>;
type ViewSubmission = Extract<Payload, { type: 'view_submission' }>;

/**
 * POST /slack/interactions: Slack's signed callbacks for the Approve and Reject buttons and the
 * rejection modal. Anything not signed with the signing secret, stale or replayed is refused with 401
 * and audited (slack.refused; past a few a minute from one address, counted into auth.denied_summary). Decisions go through the same decide() as the web form, as the
 * countersign user the Slack user maps to; every refusal is audited and told to that Slack user.
 */
export function slackInteractions(deps: SlackPageDeps, slack: SlackConfig): RequestHandler[] {
  const api = createSlackApi(slack, CALLBACK_CALL_MS);
  // The raw bytes, unparsed: the signature covers them exactly as sent.
  const raw = express.raw({ type: () => true, limit: deps.config.http.max_body_bytes });
  const handler = async (req: Request, res: Response) => {
    const ctx: Ctx = { ...deps, api, slack, ip: req.socket.remoteAddress ?? 'unknown' };
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    const timestamp = req.get('x-slack-request-timestamp');
    const signature = req.get('x-slack-signature');
    let check: SignatureCheck | 'replayed' = checkSignature(
      slack.signing_secret,
      { timestamp, signature },
      body,
      Date.now(),
    );
    if (check === 'ok' && !(await deps.slackStore.firstSighting(timestamp!, signature!))) check = 'replayed';
    if (check !== 'ok') {
      await countRefusal(ctx, check);
      return sendProblem(res, {
        code: 'NOT_LOGGED_IN',
        reason: check,
        title: 'Not a valid Slack callback',
        detail: `refused: ${check}`,
      });
    }
    const payload = parsePayload(body);
    if (!payload) {
      await countRefusal(ctx, 'bad_payload');
      return sendProblem(res, { code: 'INVALID_ARGUMENT', reason: 'bad_payload', title: 'Unknown callback' });
    }
    if (payload.type === 'block_actions') {
      await withinBudget(onAction(ctx, payload).catch((err: unknown) => fail(ctx, err)));
      res.status(200).end();
      return;
    }
    const work = onSubmission(ctx, payload).catch((err: unknown) => {
      fail(ctx, err);
      return errorsAnswer('Something went wrong; the error was logged. Please try again.');
    });
    const answer = await withinBudget(work);
    if (answer) return res.status(200).json(answer);
    // Too slow to answer in the modal: close it, and tell the user of a refusal in the channel.
    res.status(200).end();
    const late = await work;
    if (late.response_action === 'errors') await tellLater(ctx, payload.user.id, late.errors[NOTE_BLOCK]!);
  };
  return [raw, (req, res, next) => handler(req, res).catch(next)];
}

function parsePayload(body: Buffer): Payload | undefined {
  const text = new URLSearchParams(body.toString('utf8')).get('payload');
  if (!text) return undefined;
  try {
    const parsed = Payload.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

/** `work`'s result if it settles within the budget, else undefined (and `work` goes on). */
async function withinBudget<T>(work: Promise<T>): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>(
    (resolve) => (timer = setTimeout(() => resolve(undefined), ANSWER_BUDGET_MS)),
  );
  try {
    return await Promise.race([work, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** An ephemeral answer to the clicking user, through the callback's response_url. */
function teller(ctx: Ctx, responseUrl: string | undefined) {
  return async (text: string) => {
    if (!responseUrl) return;
    await ctx.api
      .respond(responseUrl, { response_type: 'ephemeral', replace_original: false, text })
      .catch((err: unknown) => fail(ctx, err));
  };
}

async function tellLater(ctx: Ctx, user: string, text: string) {
  await ctx.api
    .call('chat.postEphemeral', { channel: ctx.slack.channel, user, text })
    .catch((err: unknown) => fail(ctx, err));
}

/** What a view_submission is answered with: nothing (the modal closes), or an error under the note. */
type Answer = { response_action?: never } | { response_action: 'errors'; errors: Record<string, string> };

const errorsAnswer = (message: string): Answer => ({
  response_action: 'errors',
  errors: { [NOTE_BLOCK]: message },
});

/** A button: Approve decides at once; Reject opens the modal that asks for the note. */
async function onAction(ctx: Ctx, p: BlockActions): Promise<void> {
  const tell = teller(ctx, p.response_url);
  const action = p.actions[0]!;
  const target = parseDecisionValue(action.value);
  if ((action.action_id !== 'approve' && action.action_id !== 'reject') || !target) {
    await auditRefusal(ctx, 'bad_payload', { slack_user: p.user.id, action: action.action_id });
    return;
  }
  const admitted = await admit(ctx, p.user.id, target, action.action_id);
  if ('refusal' in admitted) return tell(admitted.refusal);
  if (action.action_id === 'reject') {
    const view = rejectModal(JSON.stringify(target));
    await ctx.api.call('views.open', { trigger_id: p.trigger_id, view }).catch(async (err: unknown) => {
      fail(ctx, err);
      await tell('The rejection form could not be opened. Please try again.');
    });
    return;
  }
  const done = await decideFor(ctx, {
    ...admitted,
    slackUser: p.user.id,
    target,
    decision: 'approve',
    note: null,
  });
  await tell('ok' in done ? done.ok : done.refusal);
}

/** The rejection modal, submitted with its note: rejects, or shows the refusal in the modal. */
async function onSubmission(ctx: Ctx, p: ViewSubmission): Promise<Answer> {
  const target = Target.safeParse(safeJson(p.view.private_metadata));
  if (!target.success) {
    await auditRefusal(ctx, 'bad_payload', { slack_user: p.user.id, action: 'reject' });
    return errorsAnswer('This form is not one countersign opened.');
  }
  const note = p.view.state.values[NOTE_BLOCK]?.[NOTE_BLOCK]?.value ?? null;
  const admitted = await admit(ctx, p.user.id, target.data, 'reject');
  if ('refusal' in admitted) return errorsAnswer(admitted.refusal);
  const done = await decideFor(ctx, {
    ...admitted,
    slackUser: p.user.id,
    target: target.data,
    decision: 'reject',
    note,
  });
  return 'ok' in done ? {} : errorsAnswer(done.refusal);
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}
