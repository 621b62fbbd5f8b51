import fs from 'node:fs';
import { chromium, type Browser } from 'playwright-core';

/** Debian's Chromium, driven by playwright-core (no browser download: the machine has no network). */
export const CHROMIUM = '/usr/bin/chromium';

const available = fs.existsSync(CHROMIUM);
if (!available && process.env.CI === 'true') {
  throw new Error(`browser tests need Chromium at ${CHROMIUM} under CI: apt-get install -y chromium`);
}

/** A browser suite's `skip`: false with Chromium, else why (CI never gets here without it: see above). */
export const withoutChromium: false | string =
  !available && `Chromium not found at ${CHROMIUM}: install Debian's chromium package to run browser tests`;

/** Headless Chromium, with nothing of its own reaching the network. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
  });
}
