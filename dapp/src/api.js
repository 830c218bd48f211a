// The gateway's HTTP API as the page uses it: config, pools, the network view, a paid question.
// Every failure becomes a GatewayError (HTTP status + the gateway's error code) or an
// UnreachableError, so errors.js can explain it in plain words.

export class GatewayError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = "GatewayError";
    this.status = status;
    this.code = code;
  }
}

export class UnreachableError extends Error {
  constructor(what) {
    super(`${what} does not answer`);
    this.name = "UnreachableError";
  }
}

async function request(path, init) {
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new UnreachableError(`The gateway at ${location.origin}`);
  }
  if (!response.ok) {
    let body = null;
    try {
      body = await response.json();
    } catch {
      body = null;
    }
    const error = body && body.error ? body.error : {};
    throw new GatewayError(
      response.status,
      String(error.code || "http_error"),
      String(error.message || `${response.status} ${response.statusText}`),
    );
  }
  return response;
}

async function getJson(path) {
  return (await request(path, { headers: { Accept: "application/json" } })).json();
}

export const loadConfig = () => getJson("/dapp/config.json");
export const loadPools = async () => (await getJson("/v1/pools")).data;
// Every served model's pool health, then the nodes of `model` (a name; null: the first).
export const loadNetwork = (model = null) =>
  getJson(model === null ? "/v1/network" : `/v1/network?model=${encodeURIComponent(model)}`);
// {payer, held_wei}: what this gateway holds against the payer's prepaid balance.
export const loadPrepaid = (address) => getJson(`/dapp/prepaid/${encodeURIComponent(address)}`);

// POST /v1/chat/completions with stream:true; calls onText(delta) as text arrives and returns
// {text, receipt, usage, finish, model} (finish: "stop" or "length"; model: the name the
// stream says answered). A failure after the stream started arrives as an error event.
export async function askStreaming({ apiKey, model, question, maxTokens, onText }) {
  const response = await request("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({
      model,
      messages: [{ role: "user", content: question }],
      max_tokens: maxTokens,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let text = "";
  let receipt = null;
  let usage = null;
  let finish = null;
  let answered = null;
  let done = false;
  while (!done) {
    const part = await reader.read();
    if (part.done) break;
    buffer += decoder.decode(part.value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") {
        done = true;
        break;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) {
        throw new GatewayError(502, String(chunk.error.code), String(chunk.error.message));
      }
      if (typeof chunk.model === "string") answered = chunk.model;
      for (const choice of chunk.choices || []) {
        if (choice.finish_reason) finish = choice.finish_reason;
        const delta = choice.delta && choice.delta.content;
        if (delta) {
          text += delta;
          onText(delta);
        }
      }
      if (chunk.usage) usage = chunk.usage;
      if (chunk.planet_receipt) receipt = chunk.planet_receipt;
    }
  }
  if (!done) {
    throw new GatewayError(502, "stream_cut", "the answer stopped before it was complete");
  }
  return { text, receipt, usage, finish, model: answered };
}
