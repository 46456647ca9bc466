// A page of another site trying to drive the proxy from a real headless Chromium (Debian's,
// through playwright-core), for tests/cross_site.rs, which checks the proxy's state after.
//
// The page is served from another port of this machine (another origin, and in the browser's
// eyes as local as the proxy: the machine's other web apps, a notebook, a dev server, are such
// pages; one on the internet reaches it by DNS rebinding). It sends what any page can send to
// another origin without the browser's leave: a no-cors POST with no body (`/pause`), a form posted as text/plain whose body is
// JSON (`/setup`), a no-cors POST of text/plain JSON (`/sessions/create`), and an image whose
// URL exports with delete. Environment: PROXY_URL, CHROMIUM_BIN, PLAYWRIGHT_CORE. Prints the
// requests the page made, as JSON.

import { createServer } from "node:http";
import { launch } from "./browser.mjs";

const { PROXY_URL: proxy } = process.env;

const page_html = `<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="setup" method="POST" action="${proxy}/setup" enctype="text/plain" target="sink">
  <input name='{"servers": [], "x": "' value='"}'>
</form>
<img id="export" src="${proxy}/export?delete=true">
<script>
  fetch("${proxy}/pause", { method: "POST", mode: "no-cors" });
  fetch("${proxy}/sessions/create", { method: "POST", mode: "no-cors",
    headers: { "Content-Type": "text/plain" }, body: "{}" });
  document.getElementById("setup").submit();
</script>
</body></html>`;

const site = createServer((_, response) => {
  response.writeHead(200, { "content-type": "text/html" });
  response.end(page_html);
});
await new Promise((ready) => site.listen(0, "127.0.0.1", ready));
const origin = `http://127.0.0.1:${site.address().port}`;

const browser = await launch();
const report = { requests: [] };
try {
  const page = await browser.newPage();
  page.on("requestfinished", async (request) => {
    if (request.url().startsWith(proxy)) {
      const response = await request.response();
      report.requests.push({ method: request.method(), url: request.url().slice(proxy.length),
        status: response ? response.status() : null });
    }
  });
  page.on("requestfailed", (request) => {
    if (request.url().startsWith(proxy)) {
      report.requests.push({ method: request.method(), url: request.url().slice(proxy.length),
        failed: request.failure()?.errorText ?? "failed" });
    }
  });
  await page.goto(`${origin}/`);
  // Four requests, each answered (or failed) by now.
  for (let waited = 0; report.requests.length < 4 && waited < 10000; waited += 100) {
    await page.waitForTimeout(100);
  }
} finally {
  await browser.close();
  site.close();
}
console.log(JSON.stringify(report));
