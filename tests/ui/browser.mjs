// Debian's Chromium through playwright-core, as the browser tests launch it (CHROMIUM_BIN and
// PLAYWRIGHT_CORE name them).

const { chromium } = await import(`${process.env.PLAYWRIGHT_CORE}/index.mjs`);

// A headless Chromium.
export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_BIN,
    // The machine's network is closed: without these Chromium keeps trying Google's hosts.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}
