import type { Command } from 'commander';
import type { AdminResults } from '../admin/commands.ts';
import { cliActor, config, out } from './io.ts';
import { runData } from './run-data.ts';

/** The upstream servers' commands (docs/upstreams.md). */

/** One pinned tool: its class (and the config's mapping, which wins), and any less gated class held back. */
function printPin(p: AdminResults['upstream.list']['pins'][number]): void {
  const config = p.config ? ` (config: ${p.config})` : '';
  const accepted = p.accepted_by ? `, accepted by ${p.accepted_by}` : '';
  out(
    `${p.upstream}__${p.tool}\t${p.class}${config}\tschema ${p.input_schema_sha256.slice(0, 12)}\t` +
      `pinned ${p.pinned_at}${accepted}`,
  );
  if (p.pending) {
    out(
      `  held: listed as ${p.pending.class} since ${p.pending.since ?? '?'}; ` +
        `to accept: countersign upstream accept ${p.upstream} ${p.tool}`,
    );
  }
}

/** `upstream list|accept`: the upstream tools' pinned classes (docs/upstreams.md). */
export function addUpstreamCommands(cli: Command): void {
  const upstream = cli
    .command('upstream')
    .description("upstream MCP servers: their tools' pinned classes (read or write)");
  upstream
    .command('list')
    .argument('[name]', 'one upstream (default: all)')
    .description("each upstream tool's pinned class, and any change held until accepted")
    .action(async (name: string | undefined) => {
      const { pins } = await runData(config(), { command: 'upstream.list', name });
      if (pins.length === 0) out('no upstream tools seen yet');
      for (const p of pins) printPin(p);
    });
  upstream
    .command('accept')
    .argument('<name>', 'the upstream')
    .argument('[tool]', 'one of its tools (default: every tool with a held change)')
    .description('re-pin tools to the less gated class their upstream now lists (audited)')
    .action(async (name: string, tool: string | undefined) => {
      const { accepted } = await runData(config(), {
        command: 'upstream.accept',
        name,
        tool,
        actor: cliActor(),
      });
      if (accepted.length === 0)
        out(`nothing to accept: no change of ${tool ? `${name} ${tool}` : name} is held`);
      for (const a of accepted) out(`${name}__${a.tool}: ${a.from} -> ${a.to} (accepted)`);
    });
}
