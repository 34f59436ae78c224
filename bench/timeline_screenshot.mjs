// Render a unisum timeline (Chrome trace-event JSON) in Chromium's built-in
// trace viewer (the DevTools Performance panel) and take a screenshot.
//   sh bench/timeline_screenshot.sh TRACE.json OUT.png [FROM_MS TO_MS]
// (the script installs Chromium and puppeteer-core, in PPTR_DIR, first).
import path from 'node:path';
const pptrDir = process.env.PPTR_DIR || '/tmp/pptr';
const { default: puppeteer } = await import(path.join(pptrDir, 'node_modules/puppeteer-core/lib/esm/puppeteer/puppeteer-core.js'));
const [trace, out, fromMs, toMs] = process.argv.slice(2);
const W = 1600, H = 1000;
const sleep = ms => new Promise(r => setTimeout(r, ms));
const browser = await puppeteer.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--enable-unsafe-swiftshader', `--window-size=${W},${H}`] });
const page = await browser.newPage();
await page.setViewport({ width: W, height: H });
await page.goto('devtools://devtools/bundled/devtools_app.html', { waitUntil: 'load' });
await sleep(3000);
await (await page.waitForSelector('pierce/#tab-timeline')).click();           // Performance panel
await sleep(1500);
await (await page.$('pierce/input[type=file]')).uploadFile(path.resolve(trace)); // its "Load trace…" input
await sleep(4000);
await page.mouse.click(1571, 77);                                             // close the shortcuts popover
await sleep(400);
const hide = await page.$('pierce/[aria-label="Hide sidebar"]');
if (hide) await hide.click();
await sleep(600);
await page.mouse.click(9, 128);                                               // expand the process group
await sleep(600);
for (let i = 15; i >= 0; i--) {                                               // expand the 16 thread tracks, bottom up
  await page.mouse.click(20, Math.round((126 + i * 18.27) * 1.152));
  await sleep(250);
}
await page.mouse.move(800, 801); await page.mouse.down();                     // enlarge the chart over the summary pane
await page.mouse.move(800, 992, { steps: 10 }); await page.mouse.up();
await sleep(600);
if (fromMs !== undefined) {                                                   // zoom: drag a window on the overview
  const pxPerMs = Number(process.env.PX_PER_MS || 58.7);
  await page.mouse.move(Number(fromMs) * pxPerMs, 75); await page.mouse.down();
  await page.mouse.move(Number(toMs) * pxPerMs, 75, { steps: 10 }); await page.mouse.up();
  await sleep(800);
}
await page.mouse.move(W - 5, H - 5);
await sleep(300);
await page.screenshot({ path: out });
await browser.close();
