/**
 * The page at `/`: a prompt box whose answer streams in from /v1/chat/completions (SSE read
 * from fetch's body by the clients' one reader, sse-reader.ts). Static HTML and a few lines of script, no build step.
 */
import { sseData } from "./sse-reader.js";

export const CHAT_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hybridgen serve</title>
<style>
  body { font: 16px/1.5 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
  textarea { width: 100%; box-sizing: border-box; font: inherit; padding: .5rem; }
  #out { white-space: pre-wrap; border-left: 3px solid #8ab; padding: .25rem .75rem; min-height: 3rem; margin-top: 1rem; }
  #status { color: #666; font-size: .875rem; }
  .row { display: flex; gap: .75rem; align-items: center; margin-top: .5rem; }
</style>
</head>
<body>
<h1>hybridgen serve</h1>
<form id="form">
  <textarea id="prompt" rows="4" placeholder="Once upon a time">Once upon a time</textarea>
  <div class="row">
    <button id="send" type="submit">Send</button>
    <label>max tokens <input id="max" type="number" value="128" min="1" style="width:5rem"></label>
    <label>temperature <input id="temp" type="number" value="0" min="0" max="2" step="0.1" style="width:4rem"></label>
    <span id="status"></span>
  </div>
</form>
<div id="out"></div>
<script>
const $ = (id) => document.getElementById(id);
const sseData = (${sseData.toString()});
$("form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const out = $("out"), status = $("status");
  out.textContent = "";
  status.textContent = "waiting…";
  $("send").disabled = true;
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "default", stream: true, stream_options: { include_usage: true },
        max_tokens: Number($("max").value), temperature: Number($("temp").value),
        messages: [{ role: "user", content: $("prompt").value }],
      }),
    });
    if (!res.ok) {
      status.textContent = "error: " + ((await res.json()).error?.message ?? res.status);
      return;
    }
    for await (const data of sseData(res.body)) {
      if (data === "[DONE]") continue;
      const msg = JSON.parse(data);
      if (msg.error) status.textContent = "error: " + msg.error.message;
      const choice = msg.choices?.[0];
      if (choice?.delta?.content) out.textContent += choice.delta.content;
      if (choice?.finish_reason) status.textContent = "finished: " + choice.finish_reason;
      if (msg.usage) status.textContent += " · " + msg.usage.completion_tokens + " tokens";
    }
  } catch (e) {
    status.textContent = "error: " + e.message;
  } finally {
    $("send").disabled = false;
  }
});
</script>
</body>
</html>
`;
