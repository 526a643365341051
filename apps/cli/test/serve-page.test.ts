// The page at `/` of `hybridgen serve`, in headless Chromium (the distribution's package, driven
// through the DevTools protocol): its prompt box streams the chat completion into the page —
// the text grows in pieces and ends as generate's greedy text, with the finish reason shown.
// Without chromium the test says so and skips (.ci/run installs it when it can).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { findChromium, launch, type Browser } from "./cdp.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT } from "./model-fixture.js";
import { startServer, type RunningServer } from "./serve-helpers.js";

const chromium = findChromium();
const WHY = "no chromium on the PATH (apt-get install chromium; .ci/run installs it when it can)";
if (!chromium) console.warn(`serve-page.test.ts skipped: ${WHY}`);

describe.skipIf(!chromium)(`hybridgen serve's page in headless Chromium${chromium ? "" : ` — skipped: ${WHY}`}`, () => {
  let server: RunningServer;
  let browser: Browser;
  beforeAll(async () => {
    requireBuiltBin();
    server = await startServer(["--threads", "1"]);
    browser = await launch(chromium!);
  });
  afterAll(async () => {
    await browser?.close();
    expect(await server?.stop()).toEqual({ code: 0, signal: null });
  });

  it("streams the completion into the page", async () => {
    const r = runBin(["generate", "--threads", "1", "--json", "-p", PROMPT, "-t", "0", "-n", "60"]);
    expect(r.code, r.stderr).toBe(0);
    const want = JSON.parse(r.stdout).text as string;
    await browser.navigate(`${server.url}/`);
    expect(await browser.evaluate<string>("document.title")).toBe("hybridgen serve");
    // Every change of the answer's text is recorded, then the form is sent as a user would.
    const snapshots = await browser.evaluate<string[]>(`new Promise((resolve) => {
      const out = document.getElementById("out"), seen = [];
      new MutationObserver(() => seen.push(out.textContent)).observe(out, { childList: true, characterData: true, subtree: true });
      document.getElementById("prompt").value = ${JSON.stringify(PROMPT)};
      document.getElementById("max").value = "60";
      document.getElementById("temp").value = "0";
      document.getElementById("send").click();
      // The button is disabled from the click until the stream has ended.
      const wait = () => document.getElementById("send").disabled ? setTimeout(wait, 20) : resolve(seen);
      wait();
    })`);
    const texts = snapshots.filter((t) => t !== "");
    expect(texts[texts.length - 1]).toBe(want);
    expect(new Set(texts).size).toBeGreaterThan(5); // it arrived in pieces, each a prefix of the next
    texts.forEach((t, i) => i > 0 && expect(t.startsWith(texts[i - 1]!)).toBe(true));
    expect(await browser.evaluate<string>(`document.getElementById("status").textContent`)).toBe("finished: length · 60 tokens");
  });
});
