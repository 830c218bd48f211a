// Drives the web dApp in a real Chromium (Debian's /usr/bin/chromium via playwright-core)
// against a running devnet gateway. One browser for the whole run; each scenario in a fresh
// browser context of its own (its own storage and its own injected wallet), so scenarios stay
// independent while the browser starts once (issue 41). Scenarios come on stdin, one JSON
// object a line; for each, one JSON line on stdout with what the page showed, for
// tests/e2e/test_dapp.py to check against the chain. The run ends at the end of stdin.
//
//   echo '{"scenario": "pay", "gateway": URL, "rpc": URL, "chain_id": 31337,
//          "private_key": "0x…", "artifacts": DIR, "chromium": PATH}' | node run.mjs
//
// Optional: "path" (the page's address below the gateway, default "/"), "second_model" (the
// prepaid scenario asks its second question of this model). The first line's "chromium"
// (default /usr/bin/chromium) is the browser of the whole run.
//
// Scenarios: readonly (no wallet), wrong_chain (wallet on chain 1, switch offered),
// insufficient (an empty account), pay (connect → pay → stream → receipt), rejected (the
// wallet answers 4001 to the payment signature; then the refund after the timeout), prepaid
// (add funds → two questions paid by vouchers, the second to `second_model` → held amount →
// withdrawal request, cancel, request, the delay passes on the chain, withdraw).
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { Wallet } from "ethers";
import { chromium } from "playwright-core";
import { TestWallet } from "./wallet.mjs";

const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const ANSWER_TIMEOUT_MS = 240_000;

// the scenario running now (one at a time): its options and what it reports
let options = null;
let out = null;



async function shots(page, name) {
  for (const [label, size] of [["desktop", DESKTOP], ["phone", PHONE]]) {
    await page.setViewportSize(size);
    const path = join(options.artifacts, `${name}-${label}.png`);
    await page.screenshot({ path, fullPage: true });
    out.screenshots.push(path);
  }
  await page.setViewportSize(DESKTOP);
}

const text = (page, selector) => page.locator(selector).innerText();

async function connect(page) {
  await page.getByRole("button", { name: "Connect wallet" }).click();
  await page.waitForFunction(() => !document.getElementById("account").hidden);
}

async function waitRightChain(page) {
  await page.waitForFunction(() =>
    document.getElementById("network-badge").classList.contains("badge-ok"),
  );
  await page.waitForFunction(() => !document.getElementById("balance").hidden);
}

async function fillQuestion(page, question, tokens) {
  await page.getByLabel("Your question", { exact: true }).fill(question);
  await page.getByLabel("Answer length (tokens)", { exact: true }).fill(String(tokens));
}

const toastSeen = (page, words) =>
  page.waitForFunction(
    (w) => [...document.querySelectorAll(".toast")].some((t) => t.textContent.includes(w)),
    words,
  );

const weiOf = (page, id) => page.locator(`#${id}`).getAttribute("data-wei");

// One question on the prepaid path; returns what the receipt card shows.
async function askPrepaid(page, question) {
  await fillQuestion(page, question, 12);
  await page.evaluate(() => {
    document.getElementById("r-chain").className = "";
  });
  await page.getByRole("button", { name: "Ask with prepaid balance" }).click();
  await page.waitForFunction(
    () => ["good", "bad"].includes(document.getElementById("r-chain").className) ||
      !document.getElementById("notice").hidden,
    null,
    { timeout: ANSWER_TIMEOUT_MS },
  );
  const shown = { notice: null, answer: await text(page, "#answer") };
  if (await page.locator("#notice").isVisible()) shown.notice = await text(page, "#notice-text");
  for (const id of ["query", "tokens", "deposit", "fee", "signature", "chain", "settlement"]) {
    shown[id] = await text(page, `#r-${id}`);
  }
  shown.deposit_label = await text(page, "#r-deposit-label");
  shown.answer_model = await text(page, "#answer-model");
  shown.answer_model_class = await page.locator("#answer-model").getAttribute("class");
  shown.signature_class = await page.locator("#r-signature").getAttribute("class");
  shown.chain_class = await page.locator("#r-chain").getAttribute("class");
  shown.payer = await page.locator("#r-chain").getAttribute("data-user");
  return shown;
}

const SCENARIOS = {
  async readonly(page) {
    await page.waitForSelector("#nodes-body tr");
    out.readonly_visible = await page.locator("#readonly").isVisible();
    out.readonly_text = await text(page, "#readonly");
    out.badge = await text(page, "#network-badge");
    out.pay_disabled = await page.locator("#pay").isDisabled();
    out.connect_visible = await page.locator("#connect").isVisible();
    out.pools = await text(page, "#pools");
    out.node_rows = await page.locator("#nodes-body tr").count();
    out.epoch_rows = await page.locator("#epochs-body tr").count();
    out.network_summary = await text(page, "#network-summary");
    // every model the gateway serves: a pool to pick in the form, a row in the network view
    await page.waitForSelector("#models-body tr[data-model]");
    const models = (selector) =>
      page.locator(selector).evaluateAll((nodes) => nodes.map((n) => n.dataset.model));
    out.pool_models = await models("#pools .pool");
    out.checked_model = await page.locator("#pools input:checked").getAttribute("value");
    out.model_rows = await models("#models-body tr");
    out.models_table = await text(page, "#models-body");
    out.nodes_caption = await text(page, "#nodes-caption");
    out.notice = (await page.locator("#notice").isVisible()) ? await text(page, "#notice-text") : null;
    await shots(page, "readonly");
  },

  async wrong_chain(page) {
    await connect(page);
    await page.waitForFunction(() =>
      document.getElementById("network-badge").classList.contains("badge-bad"),
    );
    out.badge_before = await text(page, "#network-badge");
    out.notice = await text(page, "#notice-text");
    out.pay_disabled_before = await page.locator("#pay").isDisabled();
    const action = page.locator("#notice-action");
    out.switch_label = await action.innerText();
    await shots(page, "wrong-chain");
    await action.click();
    await waitRightChain(page);
    out.badge_after = await text(page, "#network-badge");
    out.notice_after_visible = await page.locator("#notice").isVisible();
    await fillQuestion(page, "Hello?", 8);
    // the pool must also be complete (every shard routable): on a devnet just up, a shard may
    // be briefly without a routable node, and the dApp keeps Pay off until it is back
    await page
      .waitForFunction(() => !document.getElementById("pay").disabled, null, { timeout: 60_000 })
      .catch(() => {});
    out.pay_disabled_after = await page.locator("#pay").isDisabled();
    out.pool_status_after = await page.evaluate(() => document.getElementById("pay").title);
  },

  async insufficient(page, wallet) {
    await connect(page);
    await waitRightChain(page);
    out.balance = await text(page, "#balance");
    await fillQuestion(page, "What is the capital of France?", 16);
    await page.getByRole("button", { name: "Pay and ask" }).click();
    await page.waitForFunction(() => !document.getElementById("notice").hidden);
    out.notice = await text(page, "#notice-text");
    out.sent_transactions = wallet.calls.filter((m) => m === "eth_sendTransaction").length;
    await shots(page, "insufficient-funds");
  },

  async pay(page) {
    await connect(page);
    await waitRightChain(page);
    out.badge = await text(page, "#network-badge");
    out.balance_before_wei = await page.locator("#balance").getAttribute("data-wei");
    await fillQuestion(page, "Tell me a short story about a cat in Paris.", 24);
    out.estimate = await text(page, "#estimate");
    // Count how often the answer grows: a streamed answer arrives in several pieces.
    await page.evaluate(() => {
      window.__answerGrowth = [];
      new MutationObserver(() =>
        window.__answerGrowth.push(document.getElementById("answer").textContent.length),
      ).observe(document.getElementById("answer"), { childList: true, characterData: true, subtree: true });
    });
    // Tab to the button and press Enter: the form works from the keyboard.
    await page.locator("#pay").focus();
    await page.keyboard.press("Enter");
    await page.waitForSelector(".toast");
    out.toasts = [await text(page, "#toasts")];
    await page.waitForFunction(
      () => ["good", "bad"].includes(document.getElementById("r-chain").className) ||
        !document.getElementById("notice").hidden,
      null,
      { timeout: ANSWER_TIMEOUT_MS },
    );
    out.notice_visible = await page.locator("#notice").isVisible();
    if (out.notice_visible) out.notice = await text(page, "#notice-text");
    out.answer = await text(page, "#answer");
    const note = page.locator("#answer-note");
    out.answer_note = (await note.isVisible()) ? await note.innerText() : null;
    out.answer_growth = await page.evaluate(() => window.__answerGrowth);
    out.toasts.push(await text(page, "#toasts"));
    out.receipt = {};
    for (const id of ["query", "tokens", "deposit", "fee", "remainder", "signature", "chain", "settlement"]) {
      out.receipt[id] = await text(page, `#r-${id}`);
    }
    out.receipt.signature_class = await page.locator("#r-signature").getAttribute("class");
    out.receipt.chain_class = await page.locator("#r-chain").getAttribute("class");
    out.receipt.chain_amount = await page.locator("#r-chain").getAttribute("data-amount");
    out.receipt.chain_user = await page.locator("#r-chain").getAttribute("data-user");
    // The balance in the header follows the chain (polled every 5 s and after each step).
    await page.waitForFunction(
      (before) => document.getElementById("balance").dataset.wei !== before,
      out.balance_before_wei,
    );
    out.balance_after_wei = await page.locator("#balance").getAttribute("data-wei");
    await page.locator("#question").focus();
    await shots(page, "paid-answer");
  },

  async rejected(page, wallet) {
    await connect(page);
    await waitRightChain(page);
    await fillQuestion(page, "Will you answer this?", 8);
    await page.getByRole("button", { name: "Pay and ask" }).click();
    await page.waitForFunction(() => !document.getElementById("notice").hidden);
    out.notice = await text(page, "#notice-text");
    await page.waitForSelector("#history li");
    out.query_id = await page.locator("#history li").first().getAttribute("data-query");
    const refund = page.locator("#history li").first().getByRole("button", { name: "Refund" });
    out.refund_disabled_before = await refund.isDisabled();
    await shots(page, "rejected-signature");
    // Let the refund timeout pass on the chain, then refund from the page.
    const timeout = Number(options.refund_timeout_s);
    await wallet.forward("evm_increaseTime", [timeout + 1]);
    await wallet.forward("evm_mine", []);
    out.balance_before_refund_wei = (await wallet.provider.getBalance(wallet.address)).toString();
    await page.reload({ waitUntil: "load" });
    await page.waitForSelector("#pools .pool");
    await connect(page);
    await waitRightChain(page);
    await page.waitForSelector("#history li button.refund:not([disabled])");
    await page.locator("#history li").first().getByRole("button", { name: "Refund" }).click();
    await page.waitForFunction(() =>
      [...document.querySelectorAll(".toast")].some((t) => t.textContent.includes("Refund confirmed")),
    );
    await page.waitForFunction(() =>
      document.querySelector("#history li .chain-status").textContent.includes("Refunded"),
    );
    out.history_after = await text(page, "#history li");
    const toasts = await text(page, "#toasts");
    out.refund_tx = toasts.match(/Refund confirmed[^]*?(0x[0-9a-f]{64})/)[1];
    out.balance_after_refund_wei = (await wallet.provider.getBalance(wallet.address)).toString();
  },
};

SCENARIOS.prepaid = async (page, wallet) => {
  await connect(page);
  await waitRightChain(page);
  await page.waitForFunction(() => document.getElementById("p-balance").dataset.wei !== undefined);
  out.prepaid_before_wei = await weiOf(page, "p-balance");
  out.gateway_shown = await text(page, "#p-gateway");
  await page.getByLabel(/From my prepaid balance/).check();
  out.estimate = await text(page, "#estimate");
  await page.getByLabel("Amount to add (ETH)").fill("0.01");
  await page.getByRole("button", { name: "Add funds" }).click();
  await toastSeen(page, "Funds confirmed");
  out.fund_tx = (await text(page, "#toasts")).match(/Funds confirmed[^]*?(0x[0-9a-f]{64})/)[1];
  await page.waitForFunction(
    (before) => document.getElementById("p-balance").dataset.wei !== before,
    out.prepaid_before_wei,
  );
  out.prepaid_funded_wei = await weiOf(page, "p-balance");
  const start = wallet.calls.length;
  out.questions = [];
  out.questions.push(await askPrepaid(page, "Name a planet of the solar system."));
  if (options.second_model) {
    await page.locator(`#pools .pool[data-model="${options.second_model}"] input`).check();
  }
  out.questions.push(await askPrepaid(page, "Name a colour of the rainbow."));
  out.calls_while_asking = wallet.calls.slice(start);
  // The held amount is read again after each question (and every 5 s).
  await page.waitForFunction(
    (funded) =>
      document.getElementById("p-held").dataset.wei !== "0" ||
      document.getElementById("p-balance").dataset.wei !== funded,
    out.prepaid_funded_wei,
  );
  out.prepaid_after_wei = await weiOf(page, "p-balance");
  out.held_after_wei = await weiOf(page, "p-held");
  out.available_text = await text(page, "#p-available");
  await shots(page, "prepaid-answers");

  await page.getByRole("button", { name: "Request withdrawal" }).click();
  await toastSeen(page, "Withdrawal request confirmed");
  await page.waitForFunction(() => !document.getElementById("withdraw").hidden);
  out.withdrawal_text = await text(page, "#p-withdrawal");
  out.withdrawable_at = await page.locator("#p-withdrawal").getAttribute("data-at");
  out.withdraw_disabled_before = await page.locator("#withdraw").isDisabled();
  // A question now is refused by the page itself, in words, before anything is signed.
  const signed = wallet.calls.filter((m) => m === "eth_signTypedData_v4").length;
  await fillQuestion(page, "Still there?", 8);
  await page.getByRole("button", { name: "Ask with prepaid balance" }).click();
  await page.waitForFunction(() => !document.getElementById("notice").hidden);
  out.withdrawing_notice = await text(page, "#notice-text");
  out.signed_while_withdrawing =
    wallet.calls.filter((m) => m === "eth_signTypedData_v4").length - signed;
  await page.locator("#notice-close").click();
  await shots(page, "prepaid-withdrawal");
  await page.getByRole("button", { name: "Cancel withdrawal" }).click();
  await toastSeen(page, "Withdrawal cancel confirmed");
  await page.waitForFunction(() => !document.getElementById("withdraw-request").hidden);
  out.withdrawal_after_cancel = await text(page, "#p-withdrawal");
  await page.getByRole("button", { name: "Request withdrawal" }).click();
  await page.waitForFunction(() => !document.getElementById("withdraw").hidden);
  // Let the delay pass on the chain; the card's 5 s poll opens the Withdraw button.
  await wallet.forward("evm_increaseTime", [Number(options.refund_timeout_s) + 1]);
  await wallet.forward("evm_mine", []);
  await page.waitForSelector("#withdraw:not([disabled])");
  out.withdrawal_open_text = await text(page, "#p-withdrawal");
  await page.getByRole("button", { name: "Withdraw", exact: true }).click();
  await toastSeen(page, "Withdrawal confirmed");
  await page.waitForFunction(() => document.getElementById("p-balance").dataset.wei === "0");
  const toasts = await text(page, "#toasts");
  out.withdraw_tx = toasts.match(/Withdrawal confirmed[^]*?(0x[0-9a-f]{64})/)[1];
  out.prepaid_end_wei = await weiOf(page, "p-balance");
  out.withdrawal_end = await text(page, "#p-withdrawal");
};

// One scenario in a fresh context of `browser`; returns its report.
async function runScenario(browser, line) {
  options = JSON.parse(line);
  out = { scenario: options.scenario, console_errors: [], screenshots: [] };
  mkdirSync(options.artifacts, { recursive: true });
  const context = await browser.newContext({ viewport: DESKTOP });
  let wallet = null;
  let page = null;
  try {
    if (options.scenario !== "readonly") {
      const key =
        options.scenario === "insufficient" ? Wallet.createRandom().privateKey : options.private_key;
      wallet = new TestWallet({
        rpc: options.rpc,
        chainId: options.chain_id,
        privateKey: key,
        reportChainId: options.scenario === "wrong_chain" ? 1 : options.chain_id,
        rejectSignatures: options.scenario === "rejected",
      });
      await wallet.install(context);
      out.account = wallet.address;
    }
    page = await context.newPage();
    if (wallet) wallet.page = page;
    page.on("console", (message) => {
      if (message.type() === "error") out.console_errors.push(message.text());
    });
    page.on("pageerror", (error) => out.console_errors.push(`pageerror: ${error.message}`));
    await page.goto(options.gateway + (options.path || "/"), { waitUntil: "load" });
    await page.waitForSelector("#pools .pool");
    await SCENARIOS[options.scenario](page, wallet);
    if (wallet) out.wallet_calls = wallet.calls;
  } catch (error) {
    out.failure = String((error && error.stack) || error);
    if (page) {
      // What the page showed when it failed (notice, toasts, prepaid card), for the report.
      out.at_failure = await page
        .evaluate(() =>
          ["notice-text", "toasts", "p-withdrawal", "step"].map(
            (id) => `${id}: ${document.getElementById(id).textContent}`,
          ),
        )
        .catch(() => null);
    }
    if (wallet) out.wallet_calls = wallet.calls.slice(-30);
  } finally {
    await context.close();
  }
  return out;
}

async function main() {
  let browser = null;
  try {
    for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
      if (!line.trim()) continue;
      browser ??= await chromium.launch({
        executablePath: JSON.parse(line).chromium || "/usr/bin/chromium",
        headless: true,
        args: FLAGS,
      });
      process.stdout.write(JSON.stringify(await runScenario(browser, line)) + "\n");
    }
  } finally {
    if (browser) await browser.close();
  }
}

await main();
