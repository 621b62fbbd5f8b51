/**
 * The name agents call a tool by, from the name a request stores. Requests store built-in tools without
 * the configurable prefix (`send_message`: policies and required_approvers are keyed so) and upstream
 * tools as listed (`<upstream>__<tool>`, never prefixed). Built-in names hold no "__" and upstream names
 * always do, since an upstream's own name has no underscore; people and agents see one spelling.
 */
export function agentToolName(stored: string, prefix: string): string {
  return stored.includes('__') ? stored : prefix + stored;
}

/** The stored name for a name given either way (`isphere_send_message` or `send_message`), for filters. */
export function storedToolName(given: string, prefix: string): string {
  const rest = given.startsWith(prefix) ? given.slice(prefix.length) : undefined;
  return rest && !rest.includes('__') ? rest : given;
}

/** A view (or a view with more fields) as shown to people and agents: the tool under its agent name. */
export function withAgentToolName<V extends { tool: string }>(view: V, prefix: string): V {
  return { ...view, tool: agentToolName(view.tool, prefix) };
}
