/**
 * The server's front door: the only file of server/ that modules outside it import
 * (.dependency-cruiser.cjs). The call seam, the MCP server and its two transports (the HTTP endpoint,
 * stdio), the host guard, metrics and the task runner.
 */
export { createCallPipeline, type CallPipeline } from './call.ts';
export { createMcpEndpoint, isMcpPath, protectedResourceRouter } from './http.ts';
export { hostGuard } from './host-guard.ts';
export { createMcpStdio } from './stdio.ts';
export { metricsGuard } from './metrics-access.ts';
export { createMetrics, type Metrics } from './metrics.ts';
export type { WaitAccount } from './waits.ts';
export { startTaskRunner } from './task-runner.ts';
export { tracesUrl } from './tracing.ts';
