import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import type { Browser } from 'playwright-core';
import { createUser } from '../../src/accounts/users.ts';
import { launchChromium, withoutChromium } from '../helpers/chromium.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, ROOT, startTestServer, type TestServer } from '../helpers/server.ts';

const SHOTS = path.join(ROOT, 'test-results');

/** The chair's whole review in a real browser, against the real server, with a real MCP client as the agent. */
for (const kind of databaseKinds()) {
  describe(
    `the chair reviews in headless Chromium on ${kind}`,
    {
      skip: withoutChromium,
    },
    () => {
      let server: TestServer;
      let agent: Client;
      let browser: Browser;

      before(async () => {
        server = await startTestServer(kind);
        await createUser(server.sql, {
          name: 'chair-web',
          roles: ['chair'],
          password: 'web chair password',
        });
        agent = await connectHttp(server.url, server.demoToken);
        browser = await launchChromium();
        fs.mkdirSync(SHOTS, { recursive: true });
      });
      after(async () => {
        await browser?.close();
        await agent?.close();
        await server?.stop();
      });

      it('logs in from the review link, approves, and the agent then executes', async () => {
        const args = {
          target_type: 'group',
          target_id: 'gr_finance',
          content_text: 'הישיבה נדחתה ליום שני.\nThe meeting moves to Monday. 会议改期。',
        };
        const draft = await call(agent, 'isphere_send_message', args);
        const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
        await page.goto(draft.approval.review_url);
        await page.getByLabel('User name').fill('chair-web');
        await page.getByLabel('Password').fill('web chair password');
        await page.getByRole('button', { name: 'Sign in' }).click();
        await page.waitForURL(`**/approvals/${draft.approval.approval_request_id}`);
        const shown = await page.locator('pre.content').first().innerText();
        assert.equal(shown, args.content_text, 'the exact text, newlines and scripts intact');
        assert.equal(await page.locator('pre.content').first().getAttribute('dir'), 'auto');
        await page.screenshot({ path: path.join(SHOTS, `detail-${kind}.png`), fullPage: true });

        await page.goto(`${server.url}/approvals`);
        await page.screenshot({ path: path.join(SHOTS, `queue-${kind}.png`), fullPage: true });
        await page
          .getByRole('link', { name: /Review request to ועדת כספים/ })
          .first()
          .click();
        await page.getByRole('button', { name: 'Approve' }).click();
        await page.waitForURL('**?done=approved');
        assert.match(await page.getByRole('status').innerText(), /approved/);

        const got = await call(agent, 'isphere_get_approval', {
          approval_request_id: draft.approval.approval_request_id,
        });
        const sent = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: got.approval.approval_id,
        });
        assert.equal(sent.send_status, 'sent');
        await page.close();
      });

      it('rejects with a note that the agent reads through get_approval, and works at phone width', async () => {
        const draft = await call(agent, 'isphere_send_message', {
          target_type: 'contact',
          target_id: 'ct_wang',
          content_text: '请批准这条消息',
        });
        const context = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true });
        const page = await context.newPage();
        await page.goto(`${server.url}/login`);
        await page.getByLabel('User name').fill('chair-web');
        await page.getByLabel('Password').fill('web chair password');
        await page.getByRole('button', { name: 'Sign in' }).click();
        await page.waitForURL('**/approvals');
        await page.screenshot({ path: path.join(SHOTS, `queue-phone-${kind}.png`), fullPage: true });
        await page.goto(`${server.url}/approvals/${draft.approval.approval_request_id}`);
        await page.getByLabel(/Note/).fill('Not this week — 下周再说');
        await page.getByRole('button', { name: 'Reject' }).click();
        await page.waitForURL('**?done=rejected');
        const got = await call(agent, 'isphere_get_approval', {
          approval_request_id: draft.approval.approval_request_id,
        });
        assert.equal(got.approval.status, 'rejected');
        assert.equal(got.approval.note, 'Not this week — 下周再说');
        await context.close();
      });
    },
  );
}
