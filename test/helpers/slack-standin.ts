import http from 'node:http';
import type { AddressInfo } from 'node:net';

/** One call the stand-in took: the Web API method (or `response_url`), its arguments, its answer. */
export interface SlackCall {
  method: string;
  args: Record<string, unknown>;
  answer: Record<string, unknown>;
}

type Block = Record<string, unknown>;

/** What Slack itself would refuse in a message's blocks, as `invalid_blocks` does; empty when fine. */
function blockProblems(blocks: unknown): string[] {
  if (!Array.isArray(blocks) || blocks.length === 0 || blocks.length > 50) return ['blocks must be 1-50'];
  const problems: string[] = [];
  const text = (t: unknown, max: number, where: string) => {
    const o = t as { type?: unknown; text?: unknown } | undefined;
    if (!o || (o.type !== 'plain_text' && o.type !== 'mrkdwn')) problems.push(`${where}: not a text object`);
    else if (typeof o.text !== 'string' || o.text.length === 0 || o.text.length > max)
      problems.push(`${where}: text length`);
  };
  for (const [i, b] of (blocks as Block[]).entries()) {
    switch (b.type) {
      case 'header':
        text(b.text, 150, `blocks[${i}].text`);
        break;
      case 'section':
        if (b.text) text(b.text, 3000, `blocks[${i}].text`);
        for (const [j, f] of ((b.fields as unknown[]) ?? []).entries())
          text(f, 2000, `blocks[${i}].fields[${j}]`);
        if (!b.text && !b.fields) problems.push(`blocks[${i}]: a section needs text or fields`);
        break;
      case 'context':
        for (const [j, e] of ((b.elements as unknown[]) ?? []).entries())
          text(e, 3000, `blocks[${i}].elements[${j}]`);
        break;
      case 'actions':
        for (const [j, e] of ((b.elements as Block[]) ?? []).entries()) {
          if (e.type !== 'button') problems.push(`blocks[${i}].elements[${j}]: not a button`);
          text(e.text, 75, `blocks[${i}].elements[${j}].text`);
          if (typeof e.action_id !== 'string') problems.push(`blocks[${i}].elements[${j}]: no action_id`);
          if (typeof e.value !== 'string' || e.value.length > 2000)
            problems.push(`blocks[${i}].elements[${j}]: value`);
        }
        break;
      default:
        problems.push(`blocks[${i}]: unknown type ${String(b.type)}`);
    }
  }
  return problems;
}

/**
 * A local stand-in for Slack's Web API (chat.postMessage, chat.update, chat.postEphemeral, views.open,
 * users.info) and for callbacks' response_url: it checks the bot token and the shapes as Slack does,
 * answers as Slack answers, and records every call. `failures` makes the next calls of a method fail:
 * `429` (with Retry-After: 1) or a Slack error code (`ok: false`).
 */
export async function startSlackStandIn(opts: { token: string; emails: Record<string, string> }) {
  const calls: SlackCall[] = [];
  const failures: { method: string; failure: '429' | string }[] = [];
  const messages = new Map<string, { channel: string; blocks: unknown }>();
  let seq = 0;

  const answer = (method: string, args: Record<string, unknown>, form: boolean): Record<string, unknown> => {
    const need = (...keys: string[]) => keys.find((k) => args[k] === undefined || args[k] === '');
    switch (method) {
      case 'users.info': {
        if (!form) return { ok: false, error: 'invalid_arguments' }; // read methods take no JSON body
        if (need('user')) return { ok: false, error: 'user_not_found' };
        const email = opts.emails[String(args.user)];
        return email === undefined
          ? { ok: false, error: 'user_not_found' }
          : { ok: true, user: { id: args.user, profile: { email } } };
      }
      case 'chat.postMessage': {
        if (need('channel', 'text')) return { ok: false, error: 'invalid_arguments' };
        const problems = blockProblems(args.blocks);
        if (problems.length > 0) return { ok: false, error: 'invalid_blocks', errors: problems };
        const ts = `1800000000.${String(++seq).padStart(6, '0')}`;
        messages.set(ts, { channel: String(args.channel), blocks: args.blocks });
        return { ok: true, channel: args.channel, ts };
      }
      case 'chat.update': {
        if (need('channel', 'ts')) return { ok: false, error: 'invalid_arguments' };
        const known = messages.get(String(args.ts));
        if (!known || known.channel !== args.channel) return { ok: false, error: 'message_not_found' };
        const problems = blockProblems(args.blocks);
        if (problems.length > 0) return { ok: false, error: 'invalid_blocks', errors: problems };
        known.blocks = args.blocks;
        return { ok: true, channel: args.channel, ts: args.ts };
      }
      case 'chat.postEphemeral':
        return need('channel', 'user', 'text') ? { ok: false, error: 'invalid_arguments' } : { ok: true };
      case 'views.open': {
        const view = args.view as Block | undefined;
        if (need('trigger_id') || view?.type !== 'modal' || !view.title || !Array.isArray(view.blocks))
          return { ok: false, error: 'invalid_arguments' };
        return { ok: true, view: { id: `V${++seq}` } };
      }
      default:
        return { ok: false, error: 'unknown_method' };
    }
  };

  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const type = req.headers['content-type'] ?? '';
      const form = type.startsWith('application/x-www-form-urlencoded');
      const args = form
        ? Object.fromEntries(new URLSearchParams(body))
        : (JSON.parse(body || '{}') as Record<string, unknown>);
      const send = (status: number, json: Record<string, unknown>, headers: Record<string, string> = {}) => {
        res.writeHead(status, { 'content-type': 'application/json', ...headers });
        res.end(JSON.stringify(json));
      };
      const url = req.url ?? '';
      if (url.startsWith('/response/')) {
        calls.push({ method: 'response_url', args: { ...args, path: url }, answer: { ok: true } });
        return send(200, { ok: true });
      }
      const method = url.replace(/^\/api\//, '');
      if (req.headers.authorization !== `Bearer ${opts.token}`) {
        calls.push({ method, args, answer: { ok: false, error: 'invalid_auth' } });
        return send(200, { ok: false, error: 'invalid_auth' });
      }
      const failing = failures.findIndex((f) => f.method === method);
      if (failing >= 0) {
        const { failure } = failures.splice(failing, 1)[0]!;
        calls.push({ method, args, answer: { failure } });
        if (failure === '429') return send(429, { ok: false, error: 'ratelimited' }, { 'retry-after': '1' });
        return send(200, { ok: false, error: failure });
      }
      const out = answer(method, args, form);
      calls.push({ method, args, answer: out });
      send(200, out);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    calls,
    failures,
    apiBase: `${base}/api`,
    responseUrl: (n: string) => `${base}/response/${n}`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

export type SlackStandIn = Awaited<ReturnType<typeof startSlackStandIn>>;
