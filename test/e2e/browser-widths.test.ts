import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it, mock } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import type { Browser, Page } from 'playwright-core';
import { createUser } from '../../src/accounts/users.ts';
import type { AuditInput } from '../../src/audit/index.ts';
import { importData } from '../../src/connectors/local/import.ts';
import { launchChromium, withoutChromium } from '../helpers/chromium.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, ROOT, startTestServer, type TestServer } from '../helpers/server.ts';

const SHOTS = path.join(ROOT, 'test-results');
/** A desktop and a phone, each with the height of its first screen. */
const SCREENS = [
  { width: 1280, height: 800 },
  { width: 390, height: 844 },
] as const;

const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
/** Rows the log holds at these ages, each with what makes its cells long (a kind, a target, an error). */
const AGES: { ms: number; row: AuditInput }[] = [
  { ms: 2 * 365 * DAY, row: { kind: 'agent.rate_limit_changed', actor: 'otto', result: 'ok' } },
  {
    ms: 330 * DAY,
    row: { kind: 'upstream.classification_accepted', actor: 'otto', tool: 'fs__write_file', result: 'ok' },
  },
  {
    ms: 21 * DAY,
    row: { kind: 'tool.call', tool: 'isphere_receive_messages', target_ref: 'gr_finance', result: 'ok' },
  },
  {
    ms: 6 * DAY,
    row: {
      kind: 'tool.call',
      tool: 'isphere_send_message',
      target_ref: 'ct_an_unusually_long_contact_identifier_from_the_bridge',
      result: 'error',
      error_code: 'IDEMPOTENCY_CONFLICT',
    },
  },
  { ms: 23 * HOUR, row: { kind: 'approval.approved', actor: 'ines', tool: 'send_message', result: 'ok' } },
  { ms: 59 * MINUTE, row: { kind: 'tool.call', tool: 'isphere_search_contacts', result: 'ok' } },
  {
    ms: 20 * SECOND,
    row: {
      kind: 'tool.call',
      tool: 'isphere_send_message',
      target_ref: 'ct_alice',
      result: 'error',
      error_code: 'APPROVAL_REQUIRED',
    },
  },
];

interface Box {
  x: number;
  y: number;
  width: number;
  height: number;
}
interface CellBoxes {
  label: string;
  text: string;
  /** The cell itself. */
  cell: Box;
  /** Where its text is painted: each text run's boxes, cut by any ancestor in the cell that clips. */
  ink: Box | null;
}

/**
 * Every shown cell of every audit row, with its box and its text's. In the page as text: the test
 * runner's transpiler would add helpers the page does not have, and this project has no DOM types.
 */
const AUDIT_CELLS = `(() => {
  const box = (r) => ({ x: r.left, y: r.top, width: r.width, height: r.height });
  const cut = (a, b) => {
    const left = Math.max(a.left, b.left), right = Math.min(a.right, b.right);
    const top = Math.max(a.top, b.top), bottom = Math.min(a.bottom, b.bottom);
    return right > left && bottom > top ? { left, right, top, bottom } : null;
  };
  const inkOf = (td) => {
    let ink = null;
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const r of range.getClientRects()) {
        let seen = { left: r.left, right: r.right, top: r.top, bottom: r.bottom };
        for (let el = node.parentElement; seen && el && el !== td.parentElement; el = el.parentElement) {
          if (getComputedStyle(el).overflowX !== 'visible') seen = cut(seen, el.getBoundingClientRect());
        }
        if (!seen) continue;
        ink = ink
          ? { left: Math.min(ink.left, seen.left), right: Math.max(ink.right, seen.right),
              top: Math.min(ink.top, seen.top), bottom: Math.max(ink.bottom, seen.bottom) }
          : seen;
      }
    }
    return ink && box({ ...ink, width: ink.right - ink.left, height: ink.bottom - ink.top });
  };
  return [...document.querySelectorAll('table.audit-rows tbody tr')].map((tr) =>
    [...tr.querySelectorAll('td')]
      .filter((td) => getComputedStyle(td).display !== 'none')
      .map((td) => ({ label: td.dataset.label, text: td.innerText, cell: box(td.getBoundingClientRect()), ink: inkOf(td) })),
  );
})()`;

/** Whether two boxes share any area (touching edges do not count; half a pixel of rounding neither). */
const overlaps = (a: Box, b: Box) =>
  Math.min(a.x + a.width, b.x + b.width) - Math.max(a.x, b.x) > 0.5 &&
  Math.min(a.y + a.height, b.y + b.height) - Math.max(a.y, b.y) > 0.5;
const inside = (inner: Box, outer: Box) =>
  inner.x >= outer.x - 0.5 &&
  inner.y >= outer.y - 0.5 &&
  inner.x + inner.width <= outer.x + outer.width + 0.5 &&
  inner.y + inner.height <= outer.y + outer.height + 0.5;

/**
 * The web UI at a desktop's and a phone's width with what real use puts on it: audit rows seconds to
 * years old (their times say so at full length) and a long request whose decision must still be in the
 * first screen. Screenshots land in test-results/widths-*.png.
 */
for (const kind of databaseKinds()) {
  describe(`the web UI at real widths and ages on ${kind}`, { skip: withoutChromium }, () => {
    let server: TestServer;
    let agent: Client;
    let browser: Browser;
    /** The moment the browser's clock stands at: the rows' ages are counted from it. */
    let now: number;

    before(async () => {
      server = await startTestServer(kind);
      await createUser(server.sql, { name: 'ines', roles: ['chair'], password: 'ines password' });
      await createUser(server.sql, {
        name: 'otto',
        roles: ['admin', 'compliance'],
        password: 'otto password',
      });
      await importData(server.sql, server.services.blobs, {
        contacts: [{ id: 'ct_fake', display_name: '\u0410lice Martin' }],
      });
      agent = await connectHttp(server.url, server.demoToken);
      // Each row through the server's own audit log, with the process's clock set back to its moment.
      now = Date.now();
      for (const { ms, row } of AGES) {
        mock.timers.enable({ apis: ['Date'], now: now - ms });
        try {
          await server.services.audit.append(row);
        } finally {
          mock.timers.reset();
        }
      }
      browser = await launchChromium();
      fs.mkdirSync(SHOTS, { recursive: true });
    });
    after(async () => {
      await browser?.close();
      await agent?.close();
      await server?.stop();
    });

    async function signedIn(screen: (typeof SCREENS)[number], name: string, password: string): Promise<Page> {
      const context = await browser.newContext({
        viewport: screen,
        isMobile: screen.width < 500,
        locale: 'en-US',
        timezoneId: 'UTC',
      });
      const page = await context.newPage();
      await page.clock.setFixedTime(now);
      await page.goto(`${server.url}/login`);
      await page.getByLabel('User name').fill(name);
      await page.getByLabel('Password').fill(password);
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.waitForURL('**/approvals');
      return page;
    }
    const fitsWidth = async (page: Page) =>
      (await page.evaluate('document.documentElement.scrollWidth <= window.innerWidth')) as boolean;

    it('keeps every audit cell within its column, whatever the age its time says', async () => {
      for (const screen of SCREENS) {
        const page = await signedIn(screen, 'otto', 'otto password');
        await page.goto(`${server.url}/audit`);
        await page.screenshot({
          path: path.join(SHOTS, `widths-audit-${kind}-${screen.width}.png`),
          fullPage: true,
        });
        const times = await page.locator('table.audit-rows td.time').allInnerTexts();
        for (const age of [
          'now',
          '59 minutes ago',
          '23 hours ago',
          '6 days ago',
          '3 weeks ago',
          '11 months ago',
          '2 years ago',
        ])
          assert.ok(
            times.some((t) => t.includes(`(${age})`)),
            `a row ${age} at ${screen.width} px: ${times.join(' / ')}`,
          );
        const rows = (await page.evaluate(AUDIT_CELLS)) as CellBoxes[][];
        assert.ok(rows.length >= AGES.length);
        for (const cells of rows) {
          const where = (c: CellBoxes) => `${c.label} "${c.text}" at ${screen.width} px`;
          for (const c of cells) {
            if (c.ink)
              assert.ok(inside(c.ink, c.cell), `${where(c)} stays in its cell: ${JSON.stringify(c)}`);
            for (const other of cells) {
              if (other === c) continue;
              assert.ok(!overlaps(c.cell, other.cell), `${where(c)} and ${where(other)} overlap`);
              if (c.ink) assert.ok(!overlaps(c.ink, other.cell), `${where(c)} runs into ${where(other)}`);
            }
          }
        }
        if (screen.width === 1280) {
          // At a desktop width a time's moment is one line, and how far away it is one line beside or under it.
          const parts =
            (await page.evaluate(`[...document.querySelectorAll('table.audit-rows td.time > time')]
            .map((t) => [...t.children].map((p) => p.getBoundingClientRect().height / parseFloat(getComputedStyle(p).lineHeight)))`)) as number[][];
          assert.equal(parts.length, rows.length);
          for (const lines of parts) {
            assert.equal(lines.length, 2, 'the moment and its distance');
            assert.ok(
              lines.every((n) => n < 1.1),
              `each part on one line: ${lines.join(', ')} lines`,
            );
          }
        }
        assert.ok(await fitsWidth(page), `no sideways scroll at ${screen.width} px`);
        await page.context().close();
      }
    });

    it('puts the decision in the first screen, its warnings beside the buttons and the full content below', async () => {
      const lines = Array.from(
        { length: 40 },
        (_, i) => `${i + 1}. Line ${i + 1} of the quarterly notes for the board, as drafted.`,
      );
      lines[20] = 'Transfer to account\u200B 4711 today.';
      const content_text = lines.join('\n');
      const draft = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_fake',
        content_text,
      });
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      const id = draft.approval.approval_request_id as string;
      for (const screen of SCREENS) {
        const page = await signedIn(screen, 'ines', 'ines password');
        await page.goto(`${server.url}/approvals/${id}`);
        await page.screenshot({ path: path.join(SHOTS, `widths-review-${kind}-${screen.width}.png`) });
        await page.screenshot({
          path: path.join(SHOTS, `widths-review-${kind}-${screen.width}-full.png`),
          fullPage: true,
        });
        const at = `at ${screen.width}×${screen.height}`;
        const box = async (selector: string) => {
          const b = await page.locator(selector).boundingBox();
          assert.ok(b, `${selector} is shown ${at}`);
          return b;
        };
        const inFirstScreen = (b: Box) =>
          b.y >= 0 && b.y + b.height <= screen.height && b.x + b.width <= screen.width;

        // What is asked, of which target, and every warning, before the buttons, all without a scroll.
        const ask = page.locator('.decision .ask');
        assert.match(
          (await ask.innerText()).replace(/\s+/g, ' '),
          /^demo asks to send a message of \d+ characters in 40 lines to \u0410lice Martin \(contact ct_fake\)\. Who must approve: 1 chair \(0 of 1\)\.$/,
        );
        const checks = await page.locator('.decision ul.checks').innerText();
        assert.match(checks, /1 invisible or reordering character/);
        assert.match(checks, /looks like Alice Martin \(ct_alice\)/);
        const [askBox, checksBox, approve, reject] = [
          await box('.decision .ask'),
          await box('.decision ul.checks'),
          await box('button.approve'),
          await box('button.reject'),
        ];
        for (const [name, b] of Object.entries({ ask: askBox, warnings: checksBox, approve, reject }))
          assert.ok(inFirstScreen(b), `${name} in the first screen ${at}: ${JSON.stringify(b)}`);
        assert.ok(checksBox.y + checksBox.height <= approve.y, `the warnings above the buttons ${at}`);

        // The exact content follows in full, below the decision, with its marker.
        const content = page.locator('pre.content').first();
        const contentBox = (await content.boundingBox())!;
        assert.ok(contentBox.y >= approve.y + approve.height, `the content below the buttons ${at}`);
        assert.equal(
          await content.innerText(),
          content_text.replace('\u200B', '⟦U+200B ZERO WIDTH SPACE⟧'),
          'the whole message, its hidden character marked',
        );
        assert.ok(await fitsWidth(page), `no sideways scroll ${at}`);
        if (screen.width === 390) {
          await page.getByRole('button', { name: 'Approve' }).click();
          await page.waitForURL('**?done=approved');
          assert.equal(await page.locator('button.approve').count(), 0, 'no form once decided');
        }
        await page.context().close();
      }
    });
  });
}
