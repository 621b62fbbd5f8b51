import type { Command } from 'commander';
import { cliActor, config, out } from './io.ts';
import { runData } from './run-data.ts';

/**
 * `agent reseal` and `user reseal`: the operator on the host accepts a record as it now stands
 * (docs/identity.md, "Sealed records"); what was sealed is printed and audited.
 */
export function addResealCommand(group: Command, kind: 'agent' | 'user', fields: string): void {
  group
    .command('reseal')
    .argument('<name>')
    .description(
      `accept ${kind === 'agent' ? 'an agent' : 'a user'}'s record as it now stands (after checking it): ` +
        `seal its ${fields} again`,
    )
    .action(async (name: string) => {
      const actor = cliActor();
      const result =
        kind === 'agent'
          ? await runData(config(), { command: 'agent.reseal', name, actor })
          : await runData(config(), { command: 'user.reseal', name, actor });
      out(`${kind} "${name}" sealed as it stands${result.was_sealed ? ' (it was already sealed)' : ''}:`);
      out(JSON.stringify(result.sealed, null, 2));
    });
}
