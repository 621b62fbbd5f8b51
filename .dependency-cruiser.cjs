// The floors of src/ (docs/design.md): a module may import from its own floor or any floor below,
// never from a floor above, and no two modules may import each other, however indirectly.
const FLOORS = [
  ['core', '^src/(core/|config\\.ts$|log\\.ts$)'],
  ['db', '^src/(db|cluster)/'],
  ['audit', '^src/audit/'],
  ['accounts', '^src/accounts/'],
  ['connectors', '^src/connectors/'],
  ['approval', '^src/approval/'],
  ['notify', '^src/notify/'],
  ['tools', '^src/tools/'],
  ['server', '^src/server/'],
  ['web/admin', '^src/(web|admin)/'],
  ['app', '^src/app/'],
  ['cli', '^src/(cli\\.ts$|cli/)'],
];

const upward = FLOORS.flatMap(([name, path], i) =>
  FLOORS.slice(i + 1).map(([above, abovePath]) => ({
    name: `no-upward-${name.replace('/', '-')}-to-${above.replace('/', '-')}`,
    comment: `${name} is below ${above}: it may not import from it`,
    severity: 'error',
    from: { path },
    to: { path: abovePath },
  })),
);

// Folders with a front door: outside the folder, only its index.ts may be imported, so that what the
// folder offers is one file a reader can take in, and its other files can change behind it. Tests and
// benches may reach inside (they test the parts), and so may a dynamic import (the CLI loads one part
// of a folder for one command, where the front door would load all of it).
const FRONT_DOOR_FOLDERS = ['approval', 'audit', 'connectors', 'accounts', 'notify', 'tools', 'server'];
const FRONT_DOORS = FRONT_DOOR_FOLDERS.map((folder) => ({
  name: `front-door-${folder}`,
  comment: `outside src/${folder}/, import src/${folder}/index.ts, not the files behind it`,
  severity: 'error',
  from: { path: '^src/', pathNot: `^src/${folder}/` },
  to: {
    path: `^src/${folder}/`,
    pathNot: `^src/${folder}/index\\.ts$`,
    dependencyTypesNot: ['dynamic-import'],
  },
}));

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    ...upward,
    ...FRONT_DOORS,
    {
      name: 'no-database-above-the-data-floors',
      comment:
        "tools, the MCP server, the web pages and the operator's commands are given stores, never the database (knex): each table is its owner folder's (test/unit/table-owners.test.ts); db-copy moves every table, so it is the one exception",
      severity: 'error',
      from: { path: '^src/(tools|server|web|admin)/', pathNot: '^src/admin/db-copy\\.ts$' },
      to: { path: '^node_modules/knex/' },
    },
    {
      name: 'no-circular',
      comment: 'two modules importing each other (directly or through others) are one module in disguise',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true },
    },
    {
      name: 'web-and-admin-apart',
      comment: 'the web UI and the admin commands are rooms on one floor: neither reaches into the other',
      severity: 'error',
      from: { path: '^src/web/' },
      to: { path: '^src/admin/' },
    },
    {
      name: 'admin-and-web-apart',
      severity: 'error',
      from: { path: '^src/admin/' },
      to: { path: '^src/web/' },
    },
    {
      name: 'src-not-from-tests',
      comment: 'production code never imports test or bench code',
      severity: 'error',
      from: { path: '^src/' },
      to: { path: '^(test|bench)/' },
    },
    {
      name: 'not-to-unresolvable',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    // Type-only imports count: a type import that runs upward ties the floors together just the same.
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default'],
    },
  },
};
