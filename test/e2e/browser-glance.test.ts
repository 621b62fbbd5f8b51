import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import type { Browser, Page } from 'playwright-core';
import { createUser } from '../../src/accounts/users.ts';
import { launchChromium, withoutChromium } from '../helpers/chromium.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, ROOT, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

const SHOTS = path.join(ROOT, 'test-results');
const FS_SERVER = path.join(ROOT, 'node_modules/@modelcontextprotocol/server-filesystem/dist/index.js');
const WIDTHS = [1280, 390] as const;

/**
 * The web UI at a glance, at a desktop width and a phone's: the queue's filters keep their labels
 * with their inputs, the audit list stays compact and its times on one line, a decision's row names
 * the chair, the admin pages fit, the browser's /favicon.ico is there, and an upstream write's page
 * says which tool of which upstream and shows its arguments one per line, strings as written.
 * Screenshots land in test-results/glance-*.png.
 */
for (const kind of databaseKinds()) {
  describe(`the web UI at a glance on ${kind}`, { skip: withoutChromium }, () => {
    let server: TestServer;
    let agent: Client;
    let browser: Browser;
    let root: string;
    let configFile: string;

    before(async () => {
      root = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-glance-')));
      configFile = path.join(root, 'config.json');
      fs.writeFileSync(
        configFile,
        JSON.stringify({ upstreams: [{ name: 'fs', command: process.execPath, args: [FS_SERVER, root] }] }),
      );
      server = await startTestServer(kind, { COUNTERSIGN_CONFIG: configFile });
      await createUser(server.sql, { name: 'ines', roles: ['chair'], password: 'ines password' });
      await createUser(server.sql, {
        name: 'otto',
        roles: ['admin', 'compliance'],
        password: 'otto password',
      });
      agent = await connectHttp(server.url, server.demoToken);
      await waitFor(
        'the filesystem upstream',
        async () => (await agent.listTools()).tools.some((t) => t.name === 'fs__write_file') || undefined,
      );
      browser = await launchChromium();
      fs.mkdirSync(SHOTS, { recursive: true });
    });
    after(async () => {
      await browser?.close();
      await agent?.close();
      await server?.stop();
      fs.rmSync(root, { recursive: true, force: true });
    });

    async function signedIn(width: number, name: string, password: string): Promise<Page> {
      const context = await browser.newContext({ viewport: { width, height: 900 }, isMobile: width < 500 });
      const page = await context.newPage();
      await page.goto(`${server.url}/login`);
      await page.getByLabel('User name').fill(name);
      await page.getByLabel('Password').fill(password);
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.waitForURL('**/approvals');
      return page;
    }
    /** The page is no wider than its viewport: nothing to scroll sideways. */
    const fitsWidth = async (page: Page) =>
      // Evaluated in the page, as text: this project's TypeScript has no DOM types.
      (await page.evaluate('document.documentElement.scrollWidth <= window.innerWidth')) as boolean;

    it("shows an upstream write's tool and arguments readably, the raw JSON behind a disclosure", async () => {
      const content = 'Quarterly figures:\n  "revenue": 1.2M\n  path: C:\\\\shared';
      const draft = await call(agent, 'fs__write_file', { path: path.join(root, 'q4.txt'), content });
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      for (const width of WIDTHS) {
        const page = await signedIn(width, 'ines', 'ines password');
        await page.goto(`${server.url}/approvals/${draft.approval.approval_request_id}`);
        assert.equal(
          (await page.locator('h1').innerText()).trim(),
          'write_file on upstream fs',
          'the title names the tool and the upstream',
        );
        const args = page.locator('dl.args');
        assert.equal(await args.locator('dt').nth(0).innerText(), 'path');
        assert.equal(await args.locator('pre.arg').nth(0).innerText(), path.join(root, 'q4.txt'));
        assert.equal(await args.locator('pre.arg').nth(1).innerText(), content, 'the string as written');
        assert.equal(await page.locator('details.raw').getAttribute('open'), null, 'the JSON is folded');
        assert.ok(await fitsWidth(page), `no sideways scroll at ${width} px`);
        await page.screenshot({
          path: path.join(SHOTS, `glance-upstream-${kind}-${width}.png`),
          fullPage: true,
        });
        await page.context().close();
      }
    });

    it("shows an injected agent's argument with its hidden characters marked and its markup as text", async () => {
      const content = 'Pay the invoice \u202Efdp.exe<img src=x onerror="document.title=1">';
      const draft = await call(agent, 'fs__write_file', { path: path.join(root, 'pay.txt'), content });
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      const page = await signedIn(1280, 'ines', 'ines password');
      await page.goto(`${server.url}/approvals/${draft.approval.approval_request_id}`);
      const shown = await page.locator('dl.args pre.arg').nth(1).innerText();
      assert.match(shown, /⟦U\+202E RIGHT-TO-LEFT OVERRIDE⟧/);
      assert.match(shown, /<img src=x onerror="document.title=1">/, 'the markup shown as text');
      assert.equal(
        await page.locator('dl.args img, details.raw img').count(),
        0,
        'and never made an element',
      );
      assert.match(await page.locator('#hidden-count').innerText(), /invisible or reordering character/);
      await page.context().close();
    });

    it('keeps the queue filters together, the audit list compact and names the chair on decisions', async () => {
      for (let i = 0; i < 6; i++) {
        await call(agent, 'isphere_search_contacts', { query: `mar ${i}` });
      }
      const draft = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_alice',
        content_text: 'The minutes are attached.',
      });
      const chair = await signedIn(1280, 'ines', 'ines password');
      await chair.goto(`${server.url}/approvals/${draft.approval.approval_request_id}`);
      await chair.getByRole('button', { name: 'Approve' }).click();
      await chair.waitForURL('**?done=approved');
      await chair.context().close();

      for (const width of WIDTHS) {
        const page = await signedIn(width, 'otto', 'otto password');
        const label = await page.locator('label[for="agent"]').boundingBox();
        const input = await page.locator('input#agent').boundingBox();
        assert.ok(label && input);
        assert.ok(
          Math.abs(label.y + label.height / 2 - (input.y + input.height / 2)) < 8,
          'label beside its input',
        );
        assert.ok(await fitsWidth(page), `queue: no sideways scroll at ${width} px`);
        await page.screenshot({
          path: path.join(SHOTS, `glance-queue-${kind}-${width}.png`),
          fullPage: true,
        });

        await page.goto(`${server.url}/audit`);
        await page.screenshot({
          path: path.join(SHOTS, `glance-audit-${kind}-${width}.png`),
          fullPage: true,
        });
        const decision = page.locator('tr', { has: page.locator('td', { hasText: /^approval\.approved$/ }) });
        assert.match(await decision.locator('td[data-label="Agent / actor"]').innerText(), /^ines for demo$/);
        const rows = await page.locator('table.audit-rows tbody tr').count();
        const table = await page.locator('table.audit-rows').boundingBox();
        assert.ok(table && rows >= 10);
        // A few lines a row at a phone's width (it was a card of seven labelled lines, 265 px a row).
        const perRow = table.height / rows;
        assert.ok(perRow < (width === 1280 ? 60 : 90), `${Math.round(perRow)} px a row at ${width} px`);
        if (width === 1280) {
          // The time no taller than its row's seq (one line), and within its column.
          const time = await page.locator('table.audit-rows td.time').first().boundingBox();
          const seq = await page.locator('table.audit-rows td.num').first().boundingBox();
          assert.ok(time && seq && time.height <= seq.height + 1, 'the time on one line');
          const overflows = await page.evaluate(
            "[...document.querySelectorAll('table.audit-rows td.time')].some((td) => td.scrollWidth > td.clientWidth)",
          );
          assert.equal(overflows, false, 'no time runs into the next column');
        }
        assert.ok(await fitsWidth(page), `audit: no sideways scroll at ${width} px`);

        await page.goto(`${server.url}/admin/agents`);
        assert.ok(await fitsWidth(page), `admin: no sideways scroll at ${width} px`);
        await page.screenshot({
          path: path.join(SHOTS, `glance-agents-${kind}-${width}.png`),
          fullPage: true,
        });
        await page.context().close();
      }
    });

    it('answers /favicon.ico with the icon the pages link to', async () => {
      const res = await fetch(new URL('/favicon.ico', server.url));
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /^image\/svg\+xml/);
      assert.match(await res.text(), /^<svg /);
    });
  });
}
