// DOM helpers: build elements with text only (never HTML from the network), render pools, the
// network view, toasts and amounts.
import { formatEther } from "ethers";

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

export function eth(wei) {
  const text = formatEther(BigInt(wei));
  const [whole, frac = ""] = text.split(".");
  const trimmed = frac.slice(0, 6).replace(/0+$/, "");
  return `${whole}${trimmed ? `.${trimmed}` : ""} ETH`;
}

export function weiAndEth(wei) {
  return `${BigInt(wei).toString()} wei (${eth(wei)})`;
}

export const short = (hex) => (hex && hex.length > 14 ? `${hex.slice(0, 8)}…${hex.slice(-6)}` : hex);

export function toast(title, hash) {
  const box = $("toasts");
  const close = el("button", { type: "button", class: "toast-close", "aria-label": "Close" }, "×");
  const item = el("div", { class: "toast" }, close, el("strong", { text: title }));
  if (hash) item.append(el("span", { class: "mono", text: hash }));
  close.addEventListener("click", () => item.remove());
  box.append(item);
  while (box.children.length > 3) box.firstElementChild.remove();
  setTimeout(() => item.remove(), 10000);
  return item;
}

// The pools as radio buttons, `selected` (a model name) checked; onSelect(model name).
// `hashText`: how a model hash is shown (models.js shortHash).
export function renderPools(pools, selected, onSelect, hashText) {
  const box = $("pools");
  box.querySelectorAll(".pool").forEach((node) => node.remove());
  $("pools-empty").hidden = pools.length > 0;
  if (!pools.length) $("pools-empty").textContent = "This gateway lists no model pool.";
  pools.forEach((pool, index) => {
    const id = `pool-${index}`;
    const perShard = pool.routable_per_shard.map((n, s) => `shard ${s}: ${n}`).join(", ");
    const input = el("input", {
      type: "radio",
      name: "pool",
      id,
      value: pool.model,
      checked: pool.model === selected,
    });
    input.addEventListener("change", () => onSelect(pool.model));
    const label = el(
      "label",
      { for: id },
      el("span", { class: "name", text: pool.model }),
      " — ",
      el("span", { class: `health-${pool.status}`, text: pool.status }),
      el("br"),
      el("span", {
        class: "muted",
        text:
          `${pool.shards} shard${pool.shards === 1 ? "" : "s"}; ` +
          `routable nodes per shard: ${perShard}; ` +
          `price ${BigInt(pool.price_wei_per_token).toString()} wei ` +
          `(${eth(pool.price_wei_per_token)}) per token`,
      }),
      el("br"),
      el("span", { class: "muted mono", title: pool.model_hash, text: hashText(pool.model_hash) }),
    );
    box.append(el("div", { class: "pool", "data-model": pool.model }, input, label));
  });
}

// The network view's table of every served model (rows: models.js modelRows).
export function renderModels(rows) {
  const body = $("models-body");
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { colspan: 5, class: "bad", text: "no model listed" })));
  }
  for (const row of rows) {
    body.append(
      el(
        "tr",
        { "data-model": row.model, class: row.current ? "current" : null },
        el("td", { text: row.model }),
        el("td", { class: "mono", title: row.hash, text: row.hash_short }),
        el("td", { text: row.shards }),
        el("td", { text: row.price }),
        el("td", { class: `health-${row.status}`, text: row.health }),
      ),
    );
  }
}

function flags(node) {
  const why = [];
  if (node.untrusted) why.push("untrusted");
  if (node.uncommitted) why.push("uncommitted: serves without committing");
  return why.length ? ` (${why.join(", ")})` : "";
}

export function renderNetwork(view) {
  const perShard = view.pool.routable_per_shard.join(" / ");
  $("nodes-caption").textContent = `Compute nodes by shard — ${view.model}`;
  $("network-summary").textContent =
    `${view.model}: pool ${view.pool.status} — routable nodes per shard ${perShard}. ` +
    `Committee height ${view.height ?? "?"}, epoch ${view.current_epoch ?? "?"}.` +
    (view.nodes_total > view.nodes.length
      ? ` Listing ${view.nodes.length} of ${view.nodes_total} registered nodes (routable first).`
      : "");
  const body = $("nodes-body");
  body.replaceChildren();
  const byKey = new Map(view.nodes.map((node) => [node.key, node]));
  view.nodes_by_shard.forEach((keys, shard) => {
    if (!keys.length) {
      body.append(
        el("tr", {}, el("td", { text: String(shard) }),
          el("td", { colspan: 5, class: "bad", text: "no node serves this shard" })),
      );
    }
    for (const key of keys) {
      const node = byKey.get(key);
      const rep =
        node.reputation === null ? "?" : (node.reputation / view.reputation_scale).toFixed(3);
      body.append(
        el(
          "tr",
          {},
          el("td", { text: String(shard) }),
          el("td", { class: "mono", title: key, text: short(key) }),
          el("td", { text: node.status || "?" }),
          el("td", { text: rep + flags(node) }),
          el("td", { text: node.stake_wei ? eth(node.stake_wei) : "not attested" }),
          el("td", { class: node.routable ? "good" : "bad", text: node.routable ? "yes" : "no" }),
        ),
      );
    }
  });
  const epochs = $("epochs-body");
  epochs.replaceChildren();
  for (const epoch of view.epochs) {
    epochs.append(
      el(
        "tr",
        {},
        el("td", { text: String(epoch.epoch) }),
        el("td", { text: `${epoch.start_height}–${epoch.end_height}` }),
        el("td", { class: "mono", text: short(epoch.leader || "?") }),
        el("td", { text: String(epoch.challenges) }),
        el("td", { text: epoch.reputation_applied ? "yes" : "not yet" }),
      ),
    );
  }
}
