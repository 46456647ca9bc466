// Drives the token viewer in a real headless Chromium (Debian's, through playwright-core) for
// tests/viewer.rs, which checks what this prints against the proxy's own `/nodes`.
//
// Environment: PROXY_URL, SESSION (the session to open), OUT_DIR (screenshots), CHROMIUM_BIN,
// PLAYWRIGHT_CORE (the package folder), and optionally LIVE_TURN: a chat body this script posts
// to the open session, after which the new turn must appear without a reload.
// Prints one JSON object on stdout.

import { launch } from "./browser.mjs";

const { PROXY_URL: proxy, SESSION: session, OUT_DIR: out, LIVE_TURN } = process.env;

const browser = await launch();
const report = { requests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on("request", (request) => report.requests.push(request.url()));
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  page.on("console", (message) => message.type() === "error" && errors.push(message.text()));

  const served = await page.goto(`${proxy}/ui`);
  report.headers = await served.allHeaders();
  const entry = page.locator(`#session-list li[data-uuid="${session}"] a`);
  await entry.waitFor({ timeout: 15000 });
  report.listed = await page.locator("#session-list li").count();
  await page.screenshot({ path: `${out}/list.png` });

  const opened = Date.now();
  await entry.click();
  await page.locator("#tokens .t[data-i]").first().waitFor({ timeout: 30000 });
  report.open_ms = Date.now() - opened;

  const boxes = () => page.$$eval("#tokens .t[data-i]", (all) => all.map((box) => ({
    i: Number(box.dataset.i),
    classes: box.className,
    text: box.textContent,
    background: getComputedStyle(box).backgroundColor,
  })));
  report.boxes = await boxes();
  report.messages = await page.$$eval("#tokens .msg", (all) => all.map((m) => m.querySelector(".msg-head").textContent));
  report.turn_headers = await page.locator("#tokens .turn-sep").count();
  report.calls = await page.$$eval("#tokens .call", (all) => all.map((c) => ({
    name: c.dataset.call, healed: c.classList.contains("healed"), tag: c.querySelector(".call-tag").textContent,
  })));
  report.node_tabs = await page.locator(".node-tabs button").count();
  // Images stand as thumbnails, loaded from the proxy.
  await page.waitForFunction(() => [...document.querySelectorAll("#tokens img.thumb")]
    .every((img) => img.complete && img.naturalWidth > 0), null, { timeout: 15000 });
  report.images = await page.$$eval("#tokens img.thumb", (all) => all.map((img) => ({
    sha256: img.dataset.image, width: img.naturalWidth, height: img.naturalHeight,
    i: Number(img.parentElement.dataset.i),
  })));
  report.banner = await page.locator(".banner").allTextContents();

  // Hovering a sampled token shows its facts.
  const sampled = page.locator("#tokens .t[data-i]:not(.p):not(.sp)").first();
  await sampled.hover();
  await page.locator("#tip").waitFor({ state: "visible" });
  report.hovered = { i: Number(await sampled.getAttribute("data-i")), tip: await page.locator("#tip").textContent() };
  await page.screenshot({ path: `${out}/session.png` });

  // The rendered-text view: the same text, no boxes.
  await page.locator("#text-view").check();
  await page.locator("#tokens.text-view").waitFor();
  report.text_view = {
    boxes: await page.locator("#tokens .t").count(),
    text: (await page.locator("#tokens .msg-body").allTextContents()).join(""),
  };
  await page.screenshot({ path: `${out}/text.png` });
  await page.locator("#text-view").uncheck();
  await page.locator("#tokens .t[data-i]").first().waitFor();

  // Another node, when there is one: its tab opens it.
  if (report.node_tabs > 1) {
    await page.locator('.node-tabs button[data-node="1"]').click();
    await page.locator('.node-tabs button.open[data-node="1"]').waitFor();
    report.second_node = {
      boxes: await page.locator("#tokens .t[data-i]").count(),
      flagged: await page.$$eval("#tokens .t.div", (all) => all.map((b) => Number(b.dataset.i))),
      banner: await page.locator(".banner").allTextContents(),
    };
    await page.screenshot({ path: `${out}/divergence.png` });
    await page.locator('.node-tabs button[data-node="0"]').click();
    await page.locator('.node-tabs button.open[data-node="0"]').waitFor();
  }

  if (LIVE_TURN) {
    const before = (await boxes()).length;
    const status = await page.evaluate(async ([url, body]) => {
      const response = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body });
      return response.status;
    }, [`${proxy}/${session}/v1/chat/completions`, LIVE_TURN]);
    report.live = { status, before };
    await page.waitForFunction((n) => document.querySelectorAll("#tokens .t[data-i]").length > n, before, { timeout: 15000 });
    report.live.after = (await boxes()).length;
  }
  report.errors = [...errors];

  // The page's content policy holds: a script written into the page does not run (the
  // refusal Chromium logs comes after the errors above were taken).
  report.inline_script_ran = await page.evaluate(() => {
    const script = document.createElement("script");
    script.textContent = "window.inlineScriptRan = true";
    document.head.appendChild(script);
    return window.inlineScriptRan === true;
  });
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
