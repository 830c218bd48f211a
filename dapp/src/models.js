// Which model the page asks (issue 44: a gateway may serve several): the pools the gateway
// lists, the one the user picked or named in the page's address (?model=NAME), the network
// view's table of models, and which model answered. Pure: no DOM, testable in Node
// (tests/dapp/js_checks.mjs).
import { eth } from "./view.js";

const MAX_SHOWN_NAME = 80; // a name from the address is cut to this in messages

// The names a pool answers to: its name, its model hash, its aliases (the shard set's folder).
export function namesOf(pool) {
  return [pool.model, pool.model_hash, ...(Array.isArray(pool.aliases) ? pool.aliases : [])];
}

export function findPool(pools, name) {
  return pools.find((pool) => namesOf(pool).includes(name)) || null;
}

const clip = (text) =>
  text.length > MAX_SHOWN_NAME ? `${text.slice(0, MAX_SHOWN_NAME)}…` : text;

export const servedList = (pools) => pools.map((pool) => `“${pool.model}”`).join(", ");

// {model, notice}: the model the page starts with. `wanted` (the address's ?model=, or null):
// the pool it names when the gateway serves it; else the first pool, and a notice saying why.
export function initialModel(pools, wanted) {
  if (!pools.length) return { model: null, notice: null };
  const first = pools[0].model;
  if (wanted === null || wanted === undefined) return { model: first, notice: null };
  const text = String(wanted).trim();
  const found = text ? findPool(pools, text) : null;
  if (found) return { model: found.model, notice: null };
  const named = text ? `the model “${clip(text)}”` : "an empty model name";
  return {
    model: first,
    notice:
      `The page address asks for ${named}, but this gateway does not serve it; it serves ` +
      `${servedList(pools)}. Showing “${first}”: pick another model under “Model pool”.`,
  };
}

// The pool the user picked (by model name), or the first when it is gone (null: no pool).
export function selectedPool(pools, model) {
  return findPool(pools, model) || pools[0] || null;
}

// "sha256:1a2b3c4d…": a model hash cut to its scheme and first 8 hex digits (the full one is
// the element's title).
export function shortHash(hash) {
  const text = String(hash || "?");
  const cut = text.indexOf(":") + 1 + 8;
  return text.length > cut + 1 ? `${text.slice(0, cut)}…` : text;
}

export function healthText(pool) {
  const perShard = (pool.routable_per_shard || []).join(" / ");
  return `${pool.status} — routable nodes per shard ${perShard || "?"}`;
}

// The network view's table of models: one row per model the gateway serves (GET /v1/network's
// `models`), as text cells; `current` marks the one the node table below describes.
export function modelRows(view) {
  const models = Array.isArray(view.models) ? view.models : [];
  return models.map((model) => ({
    model: model.model,
    hash: model.model_hash,
    hash_short: shortHash(model.model_hash),
    shards: String(model.shards),
    price: `${BigInt(model.price_wei_per_token).toString()} wei (${eth(model.price_wei_per_token)})`,
    health: healthText(model.pool),
    status: model.pool.status,
    current: model.model === view.model,
  }));
}

// {text, ok}: which model answered, from the answer stream's `model` and the signed receipt's
// model id, checked against the pool the question was asked of.
export function answeredBy(asked, streamModel, receipt) {
  const receiptId = receipt && receipt.model_id ? String(receipt.model_id).toLowerCase() : null;
  const sameName = streamModel === asked.model;
  const sameId = receiptId === null || receiptId === String(asked.model_id).toLowerCase();
  if (sameName && sameId) {
    return { text: `Answered by ${asked.model}`, ok: true };
  }
  return {
    text:
      `Answered by ${streamModel || "an unnamed model"}` +
      (receiptId ? ` (receipt for model id ${receiptId})` : "") +
      `, but you asked ${asked.model}`,
    ok: false,
  };
}
