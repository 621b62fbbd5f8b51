import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { defaultSeed } from '../helpers/bridge/reference-data.ts';
import { startReferenceBridge, type ReferenceBridge } from '../helpers/bridge/reference.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * Bridge contacts named to imitate the directory's "Alice Martin" (ct_alice) with letters of other
 * scripts or compatibility forms: each is flagged on the review page, naming the entry it imitates
 * where the skeletons agree, and the scripts it mixes where it mixes them.
 */
const IMITATIONS: { id: string; name: string; looksLike: boolean; scripts?: string[] }[] = [
  { id: 'u-cyrillic', name: '\u0410lice M\u0430rtin', looksLike: true, scripts: ['Cyrillic', 'Latin'] },
  { id: 'u-greek', name: '\u0391lice \u039Cartin', looksLike: true, scripts: ['Greek', 'Latin'] },
  { id: 'u-cherokee', name: '\u13AAlice \u13B7artin', looksLike: true, scripts: ['Cherokee', 'Latin'] },
  { id: 'u-armenian', name: 'A\u056Cice Martin', looksLike: false, scripts: ['Armenian', 'Latin'] },
  {
    id: 'u-math',
    name: '\u{1D400}\u{1D425}\u{1D422}\u{1D41C}\u{1D41E} \u{1D40C}\u{1D41A}\u{1D42B}\u{1D42D}\u{1D422}\u{1D427}',
    looksLike: true,
  },
  {
    id: 'u-fullwidth',
    name: '\uFF21\uFF4C\uFF49\uFF43\uFF45 \uFF2D\uFF41\uFF52\uFF54\uFF49\uFF4E',
    looksLike: true,
  },
];

const ENTITIES: Record<string, string> = { amp: '&', quot: '"', lt: '<', gt: '>' };
const textOf = (html: string) =>
  html
    .replace(/<[^>]+>/g, '')
    .replace(/&(#\d+|[a-z]+);/g, (m, e: string) =>
      e.startsWith('#') ? String.fromCharCode(Number(e.slice(1))) : (ENTITIES[e] ?? m),
    );

for (const kind of databaseKinds()) {
  describe(`look-alike targets through the bridge on ${kind}`, () => {
    let bridge: ReferenceBridge;
    let server: TestServer;
    let agent: Client;
    let web: WebClient;

    before(async () => {
      const seed = defaultSeed();
      for (const { id, name } of IMITATIONS)
        seed.contacts.push({
          contact_id: id,
          display_name: name,
          account: null,
          department: null,
          title: null,
          active: true,
        });
      bridge = await startReferenceBridge({ seed });
      server = await startTestServer(kind, {
        COUNTERSIGN_BRIDGE_URL: bridge.url,
        COUNTERSIGN_BRIDGE_TIMEOUT_MS: '1000',
      });
      await createUser(server.sql, { name: 'ada', roles: ['chair'], password: 'ada password' });
      agent = await connectHttp(server.url, server.demoToken);
      web = new WebClient(server.url);
      await web.login('ada', 'ada password');
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
      await bridge?.close();
    });

    const review = async (target_id: string) => {
      const res = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id,
        content_text: 'the Q3 figures',
        source_preference: 'bridge',
      });
      assert.equal(res.ok, true, JSON.stringify(res.error));
      assert.equal(res.audit.source, 'bridge');
      const page = await web.get(`/approvals/${res.approval.approval_request_id as string}`);
      return textOf(page.html);
    };

    for (const { id, name, looksLike, scripts } of IMITATIONS) {
      it(`flags ${id} (${name})`, async () => {
        const text = await review(id);
        if (looksLike) assert.match(text, /looks like: Alice Martin \(ct_alice\)/, text);
        else assert.doesNotMatch(text, /looks like/);
        if (scripts) assert.ok(text.includes(`mixes scripts (${scripts.join(', ')})`), text);
        else assert.doesNotMatch(text, /mixes scripts/);
      });
    }

    it('flags nothing for a bridge contact that imitates no one', async () => {
      assert.doesNotMatch(await review('u-anna'), /looks like|mixes scripts/);
      assert.doesNotMatch(await review('u-yuki'), /looks like|mixes scripts/);
    });
  });
}
