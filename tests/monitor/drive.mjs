// Drives `mc-cluster monitor`'s page in Debian's headless chromium through
// playwright-core (scripts/setup.sh, step browser), as a teacher would:
// watches the counters move, finds the region directory, presses
// "link down" for one node and waits for it on the timeline, presses
// "link up", and tries the address without its token. Prints one JSON
// object with what it saw; tests/tests/monitor_qemu.rs asserts on it.
//
// Usage: PW_DIR=.cache/playwright/node_modules node drive.mjs URL SCREENSHOT NODE
import { createRequire } from "module";

const [url, shot, nodeArg] = process.argv.slice(2);
if (!url || !shot || nodeArg === undefined) {
  console.error("usage: drive.mjs URL SCREENSHOT NODE");
  process.exit(2);
}
const node = Number(nodeArg);
const require = createRequire((process.env.PW_DIR || ".cache/playwright/node_modules") + "/");
const { chromium } = require("playwright-core");

const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
const out = { dialogs: [] };
let failed = null;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  // A refused fault shows an alert: keep its text for the report.
  page.on("dialog", (d) => { out.dialogs.push(d.message()); d.dismiss(); });
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("live"), null, { timeout: 30000 });
  const snap = () => page.evaluate(() => ({
    seq: Number(document.getElementById("seq").textContent),
    writes: Object.fromEntries([...document.querySelectorAll("#nodes tbody tr")].map((r) =>
      [r.dataset.node, Number(r.querySelector("td.writes").textContent)])),
  }));
  const first = await snap();
  out.seq0 = first.seq;
  // The counters move (the guests are storing).
  await page.waitForFunction((s0) => Number(document.getElementById("seq").textContent) > s0 + 10, first.seq, { timeout: 60000 });
  const second = await snap();
  out.seq1 = second.seq;
  out.moved = Object.keys(second.writes).filter((n) => second.writes[n] > (first.writes[n] ?? 0));
  out.dma = await page.$$eval("#nodes td.dma", (c) => c.map((x) => x.textContent));
  // The region directory.
  await page.waitForSelector("#regions tbody tr", { timeout: 30000 });
  out.regions = await page.$$eval("#regions tbody tr", (rows) => rows.map((r) => ({
    key: r.dataset.key, kind: r.children[2].textContent, hosts: r.children[5].textContent })));
  out.heat = await page.$$eval("#heat .cell", (c) => c.length);
  // Link down from the page, seen on the timeline and in the node's row.
  await page.click(`#nodes tr[data-node="${node}"] button[data-op="link-down"]`);
  out.timeline_at_click = await page.$$eval("#timeline li", (l) => l.map((x) => x.textContent));
  await page.waitForFunction((n) => document.getElementById("timeline").textContent.includes(`node ${n}: link held down`), node, { timeout: 30000 });
  out.link_after_down = await page.textContent(`#nodes tr[data-node="${node}"] td:nth-child(3)`);
  out.timeline = await page.$$eval("#timeline li", (l) => l.map((x) => x.textContent));
  await page.screenshot({ path: shot, fullPage: true });
  await page.click(`#nodes tr[data-node="${node}"] button[data-op="link-up"]`);
  await page.waitForFunction((n) => document.getElementById("timeline").textContent.includes(`node ${n}: link released`), node, { timeout: 30000 });
  // Without the token, or with another: refused.
  const bare = url.split("?")[0];
  out.forbidden = [];
  for (const u of [bare, bare + "api/state", bare + "api/state?token=00", bare + "?token="]) {
    const r = await fetch(u);
    out.forbidden.push(r.status);
  }
  const ok = await fetch(bare + "api/state?" + url.split("?")[1]);
  out.with_token = ok.status;
} catch (e) {
  failed = e;
  out.error = String(e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
if (failed) process.exit(1);
