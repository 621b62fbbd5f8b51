import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it, type TestContext } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { type Browser, type BrowserContext, type Page } from 'playwright-core';
import { createUser } from '../../src/accounts/users.ts';
import { launchChromium, withoutChromium } from '../helpers/chromium.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/** A reader far from UTC, so that local and UTC times differ by a visible amount (5 h 30 min). */
const READER = { locale: 'en-GB', timezoneId: 'Asia/Kolkata' } as const;
const WIDTHS = [
  { name: 'desktop', viewport: { width: 1280, height: 900 }, isMobile: false },
  { name: 'phone', viewport: { width: 390, height: 844 }, isMobile: true },
] as const;

/** What time.js should show for `iso`: the reader's local date and time, spaces normalised. */
const localText = (iso: string) =>
  new Intl.DateTimeFormat(READER.locale, {
    dateStyle: 'medium',
    timeStyle: 'short',
    timeZone: READER.timezoneId,
  })
    .format(new Date(iso))
    .replace(/\s/g, ' ');
const utcTitle = (iso: string) => `${new Date(iso).toISOString().slice(0, 19).replace('T', ' ')} UTC`;

/** Signs in through the real form, starting from where an unsigned visitor of `path` is sent. */
async function signIn(page: Page, url: string, next: string, name: string, password: string) {
  await page.goto(`${url}${next}`);
  await page.getByLabel('User name').fill(name);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(`${url}${next}`);
}

/** The text and title of the <time> in the table cell labelled `label`, of the row that links to `href`. */
async function cellTime(page: Page, href: string, label: string) {
  const time = page.locator(`tr:has(a[href="${href}"]) td[data-label="${label}"] time`);
  return { text: (await time.innerText()).replace(/\s/g, ' '), title: await time.getAttribute('title') };
}

for (const kind of databaseKinds()) {
  describe(
    `the operators' pages in headless Chromium on ${kind}`,
    {
      skip: withoutChromium,
    },
    () => {
      let server: TestServer;
      let agent: Client;
      let browser: Browser;
      let shots: string;
      const contexts: BrowserContext[] = [];
      const newPage = async (viewport: { width: number; height: number }, isMobile = false) => {
        const context = await browser.newContext({ viewport, isMobile, ...READER });
        contexts.push(context);
        return context.newPage();
      };
      const shoot = async (t: TestContext, page: Page, name: string) => {
        const file = path.join(shots, `${name}-${kind}.png`);
        await page.screenshot({ path: file, fullPage: true });
        // The first screen as well: a full phone page is too tall to judge at a glance.
        await page.screenshot({ path: file.replace(/\.png$/, '-first-screen.png') });
        t.diagnostic(`screenshots: ${file} and ${path.basename(file, '.png')}-first-screen.png`);
      };

      before(async () => {
        server = await startTestServer(kind);
        const knex = server.sql;
        await createUser(knex, { name: 'cleo', roles: ['compliance'], password: 'cleo password' });
        await createUser(knex, {
          name: 'chair-b',
          roles: ['chair', 'compliance'],
          password: 'chair-b password',
        });
        agent = await connectHttp(server.url, server.demoToken);
        for (const target_id of ['ct_david', 'ct_wang']) {
          await call(agent, 'isphere_search_contacts', { query: 'a' });
          await call(agent, 'isphere_send_message', {
            target_type: 'contact',
            target_id,
            content_text: 'rows for the audit page',
          });
        }
        // The widest values a row can carry: a long upstream tool name, a target ref of two hashes.
        await server.services.audit.append({
          kind: 'tool.call',
          actor: 'an-operator-with-a-remarkably-long-account-name@example.org',
          tool: 'crm__replace_every_customer_note_in_the_whole_account_without_asking',
          target_type: 'file',
          target_ref: `${'ab12'.repeat(16)}${'cd34'.repeat(16)}`,
          result: 'error',
          error_code: 'TARGET_NOT_FOUND',
        });
        browser = await launchChromium();
        shots = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-shots-'));
      });
      after(async () => {
        for (const context of contexts) await context.close();
        await browser?.close();
        await agent?.close();
        await server?.stop();
      });

      for (const width of WIDTHS) {
        it(`shows the audit page at ${width.viewport.width} px without horizontal overflow`, async (t) => {
          const page = await newPage(width.viewport, width.isMobile);
          await signIn(page, server.url, '/audit', 'cleo', 'cleo password');
          await shoot(t, page, `audit-${width.name}`);
          // Evaluated in the page, as text: this project's TypeScript has no DOM types.
          const fits = (await page.evaluate(
            '({ scroll: document.documentElement.scrollWidth, inner: window.innerWidth })',
          )) as { scroll: number; inner: number };
          assert.ok(fits.scroll <= fits.inner, `page ${fits.scroll} px wide in a ${fits.inner} px window`);
          const inputs = [
            'From (UTC)',
            'Until (UTC)',
            'Agent',
            'Tool',
            'Kind',
            'Result',
            'Target',
            'Approval id',
          ];
          for (const label of inputs) assert.ok(await page.getByLabel(label).isVisible(), `${label} visible`);
          assert.ok(await page.getByRole('button', { name: 'Filter' }).isVisible());
          assert.ok(await page.locator('table.audit-rows').isVisible(), 'the table is visible');
          const long = page.locator('td[data-label="Tool"] .clip', { hasText: 'crm__replace_every' });
          assert.equal(
            await long.getAttribute('title'),
            'crm__replace_every_customer_note_in_the_whole_account_without_asking',
            'a cut value is whole in its title',
          );
          const boxes = await Promise.all(
            ['#since', '#until', '#agent'].map(async (id) => (await page.locator(id).boundingBox())!),
          );
          if (width.name === 'phone') {
            assert.ok(boxes[0]!.y < boxes[1]!.y && boxes[1]!.y < boxes[2]!.y, 'the filters stack');
            for (const box of boxes)
              assert.ok(box.width > width.viewport.width * 0.7, 'each filter is full width');
          } else {
            assert.equal(boxes[0]!.y, boxes[1]!.y, 'the filters share a row on a desktop');
          }
        });
      }

      it("shows times in the reader's zone and how far away, with the UTC instant in the title", async (t) => {
        const dry = await call(agent, 'isphere_send_message', {
          target_type: 'contact',
          target_id: 'ct_alice',
          content_text: 'what time is it there?',
        });
        const { approval_request_id: id, expires_at } = dry.approval as {
          approval_request_id: string;
          expires_at: string;
        };
        const page = await newPage({ width: 1280, height: 900 });
        await signIn(page, server.url, '/approvals', 'chair-b', 'chair-b password');
        await shoot(t, page, 'queue-local-times');
        const href = `/approvals/${id}`;
        const expires = await cellTime(page, href, 'Expires');
        assert.equal(expires.text, `${localText(expires_at)} (in 3 days)`);
        assert.equal(expires.title, utcTitle(expires_at));
        const created = await cellTime(page, href, 'Requested');
        assert.match(created.text, /\((now|\d+ minutes? ago)\)$/);
        assert.match(created.title ?? '', /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/);

        await page.goto(`${server.url}${href}`);
        await page.getByRole('button', { name: 'Approve' }).click();
        await page.waitForURL('**?done=approved');
        await shoot(t, page, 'detail-approved');
        const got = await call(agent, 'isphere_get_approval', { approval_request_id: id });
        const useBy = page.locator('dd.expiry time');
        assert.equal(await useBy.getAttribute('title'), utcTitle(got.approval.expires_at));
        const text = (await useBy.innerText()).replace(/\s/g, ' ');
        assert.equal(text.replace(/ \(in (1 day|24 hours)\)$/, ''), localText(got.approval.expires_at), text);
        assert.match(
          (await page.locator('dd.expiry').innerText()).replace(/\s/g, ' '),
          new RegExp(
            `^Approved — the agent must use this approval by ${localText(got.approval.expires_at)} \\(in `,
          ),
        );

        await page.goto(`${server.url}/audit`);
        const newest = page.locator('td[data-label="Time"] time').first();
        assert.match((await newest.innerText()).replace(/\s/g, ' '), /\((now|\d+ minutes? ago)\)$/);
        assert.match((await newest.getAttribute('title')) ?? '', / UTC$/);
      });
    },
  );
}
