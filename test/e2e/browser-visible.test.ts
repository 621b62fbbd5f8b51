import assert from 'node:assert/strict';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import type { Browser } from 'playwright-core';
import { createUser } from '../../src/accounts/users.ts';
import { launchChromium, withoutChromium } from '../helpers/chromium.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/** The review page of a bidi-spoofed file name in a real browser: what the chair's eyes get. */
for (const kind of databaseKinds()) {
  describe(`invisible characters in headless Chromium on ${kind}`, { skip: withoutChromium }, () => {
    let server: TestServer;
    let agent: Client;
    let browser: Browser;

    before(async () => {
      server = await startTestServer(kind);
      await createUser(server.sql, { name: 'ada', roles: ['chair'], password: 'ada password' });
      agent = await connectHttp(server.url, server.demoToken);
      browser = await launchChromium();
    });
    after(async () => {
      await browser?.close();
      await agent?.close();
      await server?.stop();
    });

    it('renders the override as a marker in reading order, each line isolated, the count above', async () => {
      const content_text =
        'שלום דוד,\nPlease open invoice_\u202Efdp.exe and pay EUR \u202E00.000,05\u202C today.';
      const draft = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text,
      });
      const page = await browser.newPage({ viewport: { width: 1100, height: 800 } });
      await page.goto(draft.approval.review_url);
      await page.getByLabel('User name').fill('ada');
      await page.getByLabel('Password').fill('ada password');
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.waitForURL(`**/approvals/${draft.approval.approval_request_id}`);

      const count = page.locator('#hidden-count');
      assert.match(await count.innerText(), /^3 invisible or reordering characters/);
      const shown = await page.locator('pre.content').first().innerText();
      assert.ok(!shown.includes('\u202E'));
      assert.match(shown, /invoice_⟦U\+202E RIGHT-TO-LEFT OVERRIDE⟧fdp\.exe/);

      // Where each part lands on screen: "invoice_", its marker and "fdp.exe" left to right, in one line.
      // In the page as text: the test runner's transpiler would add helpers the page does not have.
      const boxes = (await page.evaluate(`(() => {
        const line = [...document.querySelectorAll('pre.content bdi.line')][1];
        const rectOf = (text) => {
          for (const node of line.childNodes) {
            const at = node.textContent.indexOf(text);
            if (node.nodeType !== Node.TEXT_NODE || at < 0) continue;
            const range = document.createRange();
            range.setStart(node, at);
            range.setEnd(node, at + text.length);
            const r = range.getBoundingClientRect();
            return { left: r.left, right: r.right, top: r.top };
          }
          throw new Error('no ' + text);
        };
        const marker = line.querySelector('.hidden-char').getBoundingClientRect();
        return {
          invoice: rectOf('invoice_'),
          marker: { left: marker.left, right: marker.right, top: marker.top },
          fdp: rectOf('fdp.exe'),
          isolated: getComputedStyle(line).unicodeBidi,
        };
      })()`)) as Record<'invoice' | 'marker' | 'fdp', { left: number; right: number; top: number }> & {
        isolated: string;
      };
      assert.equal(boxes.isolated, 'isolate');
      assert.ok(boxes.invoice.right <= boxes.marker.left + 1, JSON.stringify(boxes));
      assert.ok(boxes.marker.right <= boxes.fdp.left + 1, JSON.stringify(boxes));
      assert.ok(Math.abs(boxes.invoice.top - boxes.fdp.top) < 4, 'the same line');

      const shot = path.join(os.tmpdir(), `countersign-visible-${kind}.png`);
      await page.locator('main').screenshot({ path: shot });
      await page.close();
    });
  });
}
