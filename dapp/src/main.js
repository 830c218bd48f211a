// The page: wires the wallet, the pools (one per model the gateway serves; the address may
// name one: ?model=NAME), a paid streamed question to the chosen model (per-query deposit or a
// voucher on the prepaid balance), receipts, refunds, the prepaid balance and the network view.
// Read-only when no EIP-1193 wallet is injected.
import { askStreaming, loadConfig, loadNetwork, loadPools } from "./api.js";
import { explain } from "./errors.js";
import { answeredBy, initialModel, modelRows, selectedPool, shortHash } from "./models.js";
import {
  QUERY_PAYMENT_TYPES,
  VOUCHER_TYPES,
  apiKey,
  checkReceipt,
  depositFor,
  newQueryId,
  paymentMessage,
  voucherExpiry,
  voucherKey,
  voucherMessage,
} from "./payment.js";
import { PrepaidCard } from "./prepaid.js";
import { Questions, STATUS } from "./questions.js";
import {
  $,
  el,
  eth,
  renderModels,
  renderNetwork,
  renderPools,
  short,
  toast,
  weiAndEth,
} from "./view.js";
import { Wallet } from "./wallet.js";

const state = {
  config: null,
  pools: [],
  selected: null, // the chosen model's name (null until the pools load: then the first's)
  wallet: null,
  questions: null,
  busy: false,
  refundTimeout: null,
  mode: "deposit", // "deposit": per-query deposit; "prepaid": a voucher on the prepaid balance
  prepaid: null, // PrepaidCard once a wallet is injected
};

// ------------------------------------------------------------------------------ notices

function notify(text, action = null) {
  $("notice-text").textContent = text;
  const button = $("notice-action");
  button.hidden = !action;
  if (action) {
    button.textContent = action.label;
    button.onclick = action.run;
  }
  $("notice").hidden = false;
}

function clearNotice() {
  $("notice").hidden = true;
}

function fail(error, context) {
  notify(explain(error, context).text);
}

function step(text) {
  $("step").textContent = text;
}

// ------------------------------------------------------------------------------- header

function setBadge(kind, text) {
  const badge = $("network-badge");
  badge.className = `badge badge-${kind}`;
  badge.textContent = text;
}

async function refreshBalance() {
  const wallet = state.wallet;
  if (!wallet || !wallet.account || !wallet.onRightChain) return;
  try {
    const wei = await wallet.balance();
    $("balance").textContent = eth(wei);
    $("balance").dataset.wei = wei.toString();
    $("balance").hidden = false;
  } catch {
    $("balance").textContent = "balance unavailable";
  }
  if (state.prepaid) await state.prepaid.refresh();
}

function pool() {
  return selectedPool(state.pools, state.selected);
}

function updatePay() {
  const wallet = state.wallet;
  const ready = wallet && wallet.account && wallet.onRightChain;
  const current = pool();
  const complete = current && current.status !== "incomplete";
  $("pay").disabled = !(ready && complete) || state.busy;
  $("pay").textContent = state.mode === "prepaid" ? "Ask with prepaid balance" : "Pay and ask";
  if (!wallet) $("pay").title = "read-only: no wallet";
  else if (!wallet.account) $("pay").title = "connect your wallet first";
  else if (!wallet.onRightChain) $("pay").title = "switch your wallet to this network first";
  else if (!complete) $("pay").title = "the pool is incomplete";
  else $("pay").removeAttribute("title");
}

async function checkChain() {
  const wallet = state.wallet;
  const config = state.config;
  if (wallet.onRightChain) {
    setBadge("ok", `${config.chain_name} · chain ${config.chain_id}`);
    if ($("notice").dataset.kind === "chain") clearNotice();
    $("notice").dataset.kind = "";
    await refreshBalance();
    await loadHistory();
  } else {
    setBadge("bad", `Wrong network: chain ${wallet.chainId}`);
    $("balance").hidden = true;
    $("prepaid-card").hidden = true;
    notify(
      `Your wallet is on chain ${wallet.chainId}, but this gateway is paid on ` +
        `${config.chain_name} (chain ${config.chain_id}). Switch networks to ask.`,
      { label: `Switch to ${config.chain_name}`, run: switchChain },
    );
    $("notice").dataset.kind = "chain";
  }
  updatePay();
}

async function switchChain() {
  try {
    await state.wallet.switchChain();
    await checkChain();
  } catch (error) {
    fail(error, "Switching networks failed");
  }
}

async function connect() {
  const wallet = state.wallet;
  try {
    await wallet.connect();
  } catch (error) {
    fail(error, "Connecting the wallet failed");
    return;
  }
  if (!wallet.account) {
    notify("The wallet shared no account with this page.");
    return;
  }
  $("connect").hidden = true;
  $("account").textContent = short(wallet.account);
  $("account").title = wallet.account;
  $("account").hidden = false;
  state.questions = new Questions(state.config, wallet.account);
  await checkChain();
}

// -------------------------------------------------------------------------------- pools

async function refreshPools({ quiet = false } = {}) {
  let pools;
  try {
    pools = await loadPools();
  } catch (error) {
    if (quiet) return; // a periodic refresh keeps the last view; a user action reports
    pools = [];
    fail(error, "Loading the model pools failed");
  }
  const changed = JSON.stringify(pools) !== JSON.stringify(state.pools);
  state.pools = pools;
  if (state.selected === null && pools.length) {
    // the first load: the model the address names (?model=), else the first
    const wanted = new URLSearchParams(window.location.search).get("model");
    const start = initialModel(pools, wanted);
    state.selected = start.model;
    if (start.notice) notify(start.notice);
  }
  const current = pool();
  if (current && current.model !== state.selected) state.selected = current.model; // gone
  if (!changed && document.querySelector("#pools .pool")) return; // keep focus and selection
  renderPools(state.pools, state.selected, (model) => {
    state.selected = model;
    showPoolWarning();
    updateEstimate();
    updatePay();
    refreshNetwork();
  }, shortHash);
  showPoolWarning();
  updateEstimate();
  updatePay();
}

function showPoolWarning() {
  const current = pool();
  const warning = $("pool-warning");
  if (current && current.status === "incomplete") {
    const empty = current.routable_per_shard.findIndex((n) => n === 0);
    warning.textContent =
      `This pool is incomplete: shard ${empty} has no routable node, so it cannot answer now. ` +
      "Paying would only lock your deposit until the refund timeout.";
    warning.hidden = false;
  } else {
    warning.hidden = true;
  }
}

function updateEstimate() {
  const current = pool();
  const maxTokens = Number($("max-tokens").value);
  if (!current || !Number.isInteger(maxTokens) || maxTokens < 1) {
    $("estimate").textContent = "";
    return;
  }
  try {
    const amount = depositFor($("question").value, maxTokens, current.price_wei_per_token);
    $("estimate").textContent =
      state.mode === "prepaid"
        ? `Voucher limit for this question: ${weiAndEth(amount)}, no gas. ` +
          "Only the tokens used are charged to your prepaid balance."
        : `Deposit for this question: ${weiAndEth(amount)} (plus gas). ` +
          "You pay only for the tokens used; the rest stays refundable.";
  } catch (error) {
    $("estimate").textContent = error.message;
  }
}

// ------------------------------------------------------------------------------ network

// Every served model, then the nodes of the one chosen in the ask form.
async function refreshNetwork() {
  const model = state.selected;
  try {
    const view = await loadNetwork(model);
    if (state.selected !== model) return; // another model was picked meanwhile: its view follows
    renderModels(modelRows(view));
    renderNetwork(view);
  } catch (error) {
    $("network-summary").textContent = explain(error, "The network view is unavailable").text;
  }
}

// ---------------------------------------------------------------------------------- ask

async function ask(event) {
  event.preventDefault();
  const wallet = state.wallet;
  const config = state.config;
  const question = $("question").value.trim();
  const maxTokens = Number($("max-tokens").value);
  if (!question) {
    notify("Write a question first.");
    $("question").focus();
    return;
  }
  if (!Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > 1024) {
    notify("The answer length must be a whole number of tokens between 1 and 1024.");
    $("max-tokens").focus();
    return;
  }
  const asked = pool(); // the model asked: fixed for this question even if the pools change
  if (!asked) {
    notify("This gateway lists no model to ask; reload the page once its pools are back.");
    return;
  }
  clearNotice();
  state.busy = true;
  updatePay();
  try {
    if (state.mode === "prepaid") await askWithVoucher(wallet, config, asked, question, maxTokens);
    else await payAndAsk(wallet, config, asked, question, maxTokens);
  } finally {
    state.busy = false;
    step("");
    updatePay();
    await refreshBalance();
    await loadHistory();
    refreshPools();
  }
}

async function payAndAsk(wallet, config, asked, question, maxTokens) {
  const amount = depositFor(question, maxTokens, asked.price_wei_per_token);
  const balance = await wallet.balance();
  if (balance <= amount) {
    notify(
      `Insufficient funds: this question needs a deposit of ${weiAndEth(amount)} plus gas, ` +
        `but your account holds ${eth(balance)}. Fund the account and try again.`,
    );
    return;
  }
  const queryId = newQueryId();
  step(`Step 1 of 3: deposit ${eth(amount)} into the escrow — confirm it in your wallet.`);
  let receipt;
  try {
    const escrow = await wallet.escrow();
    // Bound to this gateway: no other gateway can serve (or be paid by) this deposit.
    const tx = await escrow.deposit(queryId, asked.model_id, wallet.gateway, { value: amount });
    toast("Deposit sent", tx.hash);
    step("Step 1 of 3: waiting for the deposit to be mined…");
    receipt = await tx.wait();
    toast(`Deposit confirmed in block ${receipt.blockNumber}`, tx.hash);
  } catch (error) {
    fail(error, "The deposit did not go through");
    return;
  }
  state.questions.add({
    queryId,
    question,
    model: asked.model,
    deposit: amount.toString(),
    status: STATUS.unsigned,
  });
  await refreshBalance();

  step("Step 2 of 3: sign the payment proof in your wallet (no gas).");
  let signature;
  try {
    const signer = await wallet.provider.getSigner(wallet.account);
    signature = await signer.signTypedData(
      config.payment_domain,
      QUERY_PAYMENT_TYPES,
      paymentMessage(queryId, config, amount, asked.model_id),
    );
  } catch (error) {
    notify(
      `${explain(error, "The payment proof was not signed").text} Your deposit stays in the ` +
        "escrow; refund it under “Your questions” once the refund timeout has passed.",
    );
    return;
  }
  const key = apiKey(queryId, amount, signature);

  step("Step 3 of 3: the network is answering…");
  state.questions.update(queryId, { status: STATUS.asked });
  const result = await streamAnswer(asked, key, question, maxTokens, queryId, amount, false);
  if (!result) {
    state.questions.update(queryId, { status: STATUS.failed });
    return;
  }
  state.questions.update(queryId, { status: STATUS.answered, receipt: result.receipt });
  await showReceipt(queryId, amount, result.receipt);
  toast("Answer received", queryId);
}

// The prepaid path: check the balance, sign a voucher capped at the same quote the per-query
// path deposits (no transaction), ask. Nothing to refund: an unanswered question is not charged.
async function askWithVoucher(wallet, config, asked, question, maxTokens) {
  const cap = depositFor(question, maxTokens, asked.price_wei_per_token);
  const info = await state.prepaid.refresh();
  if (!info) {
    notify("The prepaid balance could not be read; check the wallet's network and try again.");
    return;
  }
  if (info.withdrawableAt !== 0n) {
    notify(
      "Your prepaid balance is being withdrawn, so the gateway accepts no voucher from it. " +
        "Cancel the withdrawal under “Prepaid balance”, or choose to pay per question.",
    );
    return;
  }
  if (info.available < cap) {
    notify(
      `Not enough prepaid balance: this question may cost up to ${weiAndEth(cap)}, but your ` +
        `balance has ${weiAndEth(info.available)} available (${eth(info.balance)} in the escrow, ` +
        `${eth(info.held)} held by the gateway for recent questions until the epoch settles). ` +
        "Add funds under “Prepaid balance”, or choose to pay per question.",
    );
    return;
  }
  const queryId = newQueryId();
  const expiry = voucherExpiry(Date.now(), config);
  step("Step 1 of 2: sign the voucher in your wallet (no transaction, no gas).");
  let signature;
  try {
    const signer = await wallet.provider.getSigner(wallet.account);
    signature = await signer.signTypedData(
      config.payment_domain,
      VOUCHER_TYPES,
      voucherMessage(queryId, config, cap, expiry, asked.model_id),
    );
  } catch (error) {
    notify(`${explain(error, "The voucher was not signed").text} Nothing was charged.`);
    return;
  }
  step("Step 2 of 2: the network is answering…");
  const key = voucherKey(queryId, cap, expiry, signature);
  const result = await streamAnswer(asked, key, question, maxTokens, queryId, cap, true);
  if (!result) return;
  await showPrepaidReceipt(queryId, cap, result.receipt);
  toast("Answer received", queryId);
}

// Streams the answer of the model `asked` (a pool) into the answer card; returns
// askStreaming's result, or null after saying why there is none.
async function streamAnswer(asked, key, question, maxTokens, queryId, amount, prepaid) {
  $("answer-card").hidden = false;
  $("answer-question").textContent = question;
  $("answer-model").textContent = `Asked ${asked.model}…`;
  $("answer-model").className = "muted";
  $("answer-model").dataset.model = "";
  $("answer").textContent = "";
  $("answer-note").hidden = true;
  $("answer").setAttribute("aria-busy", "true");
  clearReceipt(queryId, amount, prepaid);
  let result;
  try {
    result = await askStreaming({
      apiKey: key,
      model: asked.model,
      question,
      maxTokens,
      onText: (delta) => $("answer").append(delta),
    });
  } catch (error) {
    notify(explain(error, "No answer", { prepaid }).text);
    return null;
  } finally {
    $("answer").setAttribute("aria-busy", "false");
  }
  const by = answeredBy(asked, result.model, result.receipt);
  $("answer-model").textContent = by.text;
  $("answer-model").className = by.ok ? "good" : "bad";
  $("answer-model").dataset.model = result.model || "";
  $("r-model").textContent = `${asked.model} (${short(asked.model_id)})`;
  if (result.finish === "length") {
    $("answer-note").textContent =
      "The answer stopped at the length you chose; ask again with a longer answer length.";
    $("answer-note").hidden = false;
  }
  return result;
}

function clearReceipt(queryId, amount, prepaid) {
  $("r-query").textContent = queryId;
  $("r-deposit-label").textContent = prepaid ? "Voucher limit" : "Deposit";
  $("r-remainder-label").textContent = prepaid ? "Not charged" : "Refundable remainder";
  $("r-deposit").textContent = prepaid ? `${weiAndEth(amount)} (prepaid)` : weiAndEth(amount);
  for (const id of [
    "r-model",
    "r-tokens",
    "r-fee",
    "r-remainder",
    "r-signature",
    "r-chain",
    "r-settlement",
  ]) {
    $(id).textContent = "…";
    $(id).className = "";
  }
  delete $("r-chain").dataset.amount;
  delete $("r-chain").dataset.user;
}

// The receipt's signed fields and the page's own check of the gateway's signature; false when
// there is no receipt.
function showSignedReceipt(queryId, amount, receipt) {
  if (!receipt) {
    $("r-signature").textContent = "the gateway sent no receipt";
    $("r-signature").className = "bad";
    return false;
  }
  const fee = BigInt(receipt.fee_wei);
  $("r-tokens").textContent =
    `${receipt.prompt_tokens} prompt + ${receipt.completion_tokens} completion`;
  $("r-fee").textContent = weiAndEth(fee);
  $("r-remainder").textContent = weiAndEth(amount - fee);
  const check = checkReceipt(receipt, state.config);
  const verified = check.signatureOk && check.circuitOk && receipt.query_id === queryId;
  $("r-signature").textContent = verified
    ? `verified: signed by the gateway ${short(check.signer)} over ${receipt.nodes.length} nodes`
    : `NOT verified (signer ${check.signer || "unknown"}, circuit ${check.circuitOk ? "ok" : "bad"})`;
  $("r-signature").className = verified ? "good" : "bad";
  return true;
}

async function showPrepaidReceipt(queryId, cap, receipt) {
  if (!showSignedReceipt(queryId, cap, receipt)) return;
  const voucher = receipt.voucher || {};
  const mine =
    String(receipt.payer || "").toLowerCase() === state.wallet.account.toLowerCase() &&
    voucher.fee_cap_wei === cap.toString();
  const info = await state.prepaid.refresh();
  const who = mine
    ? "charged to your prepaid balance by your voucher"
    : "the receipt names another payer or voucher limit";
  const held = info
    ? ` — in the escrow ${weiAndEth(info.balance)}, held by the gateway ${weiAndEth(info.held)}`
    : "";
  $("r-chain").textContent = who + held;
  $("r-chain").className = mine ? "good" : "bad";
  $("r-chain").dataset.user = receipt.payer || "";
  $("r-chain").dataset.amount = info ? info.held.toString() : "";
  $("r-settlement").textContent =
    "pending: the committee debits the fee from your prepaid balance when it posts this " +
    "epoch's payout root; until then the gateway holds it against your balance";
}

async function showReceipt(queryId, amount, receipt) {
  if (!showSignedReceipt(queryId, amount, receipt)) return;
  try {
    const escrow = await state.wallet.escrow();
    const onChain = await escrow.depositOf(queryId);
    const mine = onChain.user.toLowerCase() === state.wallet.account.toLowerCase();
    const same =
      onChain.amount === amount &&
      onChain.gateway.toLowerCase() === state.wallet.gateway.toLowerCase();
    $("r-chain").textContent =
      `${STATUS_NAMES[Number(onChain.status)]}: ${weiAndEth(onChain.amount)} held for ` +
      `${short(onChain.user)}${mine ? " (you)" : ""} at gateway ${short(onChain.gateway)} — ` +
      (mine && same ? "matches your deposit" : "does NOT match your deposit");
    $("r-chain").className = mine && same ? "good" : "bad";
    $("r-chain").dataset.amount = onChain.amount.toString();
    $("r-chain").dataset.user = onChain.user;
    $("r-settlement").textContent = settlementText(Number(onChain.status));
  } catch (error) {
    $("r-chain").textContent = explain(error, "reading the escrow failed").text;
  }
}

const STATUS_NAMES = ["None", "Funded", "Settled", "Reclaimed", "Refunded"];

function settlementText(status) {
  if (status === 1) {
    return (
      "pending: the committee has not settled this question into an epoch payout yet; " +
      "after settlement the remainder is refundable"
    );
  }
  if (status === 2) return "settled: the fee went to the epoch payout; refund the remainder";
  if (status === 4) return "refunded";
  return STATUS_NAMES[status] || "unknown";
}

// ----------------------------------------------------------------------- history, refund

async function timeout(escrow) {
  if (state.refundTimeout === null) state.refundTimeout = await escrow.refundTimeout();
  return state.refundTimeout;
}

async function loadHistory() {
  const wallet = state.wallet;
  if (!wallet || !wallet.onRightChain || !state.questions) return;
  const items = state.questions.all();
  $("history-card").hidden = items.length === 0;
  if (!items.length) return;
  let escrow;
  let now;
  let wait;
  try {
    escrow = await wallet.escrow();
    now = await wallet.chainTime();
    wait = await timeout(escrow);
  } catch {
    return;
  }
  const list = $("history");
  const rows = [];
  for (const item of items) {
    let onChain = null;
    try {
      onChain = await escrow.depositOf(item.queryId);
    } catch {
      onChain = null;
    }
    rows.push(historyRow(item, onChain, now, wait));
  }
  list.replaceChildren(...rows);
}

function historyRow(item, onChain, now, wait) {
  const status = onChain ? Number(onChain.status) : null;
  const answered = item.status === STATUS.answered;
  const row = el(
    "li",
    { "data-query": item.queryId },
    el("span", { class: "q", text: item.question }),
    el("span", {
      class: "muted",
      text: `${item.model ? `${item.model} · ` : ""}${eth(item.deposit)} · ${item.status}`,
    }),
  );
  const chainText = status === null ? "on chain: ?" : `on chain: ${STATUS_NAMES[status]}`;
  row.append(el("span", { class: "chain-status", text: chainText }));
  if (status === 1 && !answered) {
    const availableAt = BigInt(onChain.depositedAt) + BigInt(wait);
    const button = el("button", { type: "button", class: "refund", text: "Refund" });
    if (now < availableAt) {
      button.disabled = true;
      const seconds = Number(availableAt - now);
      button.title = `refund available in about ${Math.ceil(seconds / 60)} min (chain time)`;
      row.append(el("span", { class: "muted", text: `refund in ~${Math.ceil(seconds / 60)} min` }));
    }
    button.addEventListener("click", () => refund(item.queryId, button));
    row.append(button);
  }
  return row;
}

async function refund(queryId, button) {
  button.disabled = true;
  try {
    const escrow = await state.wallet.escrow();
    const tx = await escrow.refund(queryId);
    toast("Refund sent", tx.hash);
    const mined = await tx.wait();
    toast(`Refund confirmed in block ${mined.blockNumber}`, tx.hash);
    state.questions.update(queryId, { status: STATUS.refunded });
  } catch (error) {
    fail(error, "The refund did not go through");
  }
  await refreshBalance();
  await loadHistory();
}

// -------------------------------------------------------------------------------- start

async function start() {
  $("notice-close").addEventListener("click", clearNotice);
  $("network-refresh").addEventListener("click", refreshNetwork);
  $("ask-form").addEventListener("submit", ask);
  $("question").addEventListener("input", updateEstimate);
  $("max-tokens").addEventListener("input", updateEstimate);
  try {
    state.config = await loadConfig();
  } catch (error) {
    setBadge("unknown", "Gateway unreachable");
    fail(error, "This page cannot load its settings");
    return;
  }
  await refreshPools();
  refreshNetwork();
  setInterval(refreshNetwork, 10000);
  setInterval(() => refreshPools({ quiet: true }), 10000);
  const ethereum = window.ethereum;
  if (!ethereum || typeof ethereum.request !== "function") {
    setBadge("unknown", `Read-only · ${state.config.chain_name}`);
    $("readonly").hidden = false;
    updatePay();
    return;
  }
  state.wallet = new Wallet(ethereum, state.config);
  state.prepaid = new PrepaidCard(state.wallet, notify, loadHistory);
  for (const id of ["mode-deposit", "mode-prepaid"]) {
    $(id).addEventListener("change", (event) => {
      state.mode = event.target.value;
      updateEstimate();
      updatePay();
    });
  }
  $("connect").hidden = false;
  $("connect").addEventListener("click", connect);
  setBadge("unknown", "Wallet not connected");
  state.wallet.on("chainChanged", async () => {
    if (!state.wallet.account) return;
    await state.wallet.readChain();
    await checkChain();
  });
  state.wallet.on("accountsChanged", async (accounts) => {
    if (!accounts || !accounts.length) {
      window.location.reload();
      return;
    }
    await connect();
  });
  setInterval(refreshBalance, 5000);
  setInterval(loadHistory, 15000);
  updatePay();
}

start();
