const { PGlite } = await import('@electric-sql/pglite');
const opts = JSON.parse(process.argv[2]||'{}');
const t=performance.now();
const db = await PGlite.create('/tmp/tmp.5VMegLtust/pglite', opts);
const r = await db.query("select current_setting('shared_buffers') sb, current_setting('work_mem') wm, current_setting('wal_buffers') wb, current_setting('maintenance_work_mem') mwm");
for (let i=0;i<200;i++) await db.query("select * from audit_events order by seq desc limit 50");
const m = process.memoryUsage();
console.log(JSON.stringify(r.rows[0]), 'open+q ms', (performance.now()-t)|0, 'rss', (m.rss/1048576)|0, 'ab', (m.arrayBuffers/1048576)|0);
await db.close();
