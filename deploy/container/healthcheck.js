// The image's HEALTHCHECK: exit 0 when this replica's /healthz answers 200 (ready, its database
// reachable), else 1. Node only, no curl. The Host is "localhost": keep it in http.allowed_hosts.
import http from 'node:http';

const port = Number(process.env.COUNTERSIGN_PORT || 8787);
const req = http.get({
  host: '127.0.0.1',
  port,
  path: '/healthz',
  headers: { Host: 'localhost' },
  timeout: 4000,
});
req.on('response', (res) => {
  res.resume();
  process.exit(res.statusCode === 200 ? 0 : 1);
});
req.on('timeout', () => req.destroy(new Error('timed out')));
req.on('error', (err) => {
  process.stderr.write(`healthcheck: ${err.message}\n`);
  process.exit(1);
});
