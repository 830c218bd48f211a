// The prepaid balance card: what the escrow holds for the account at the gateway serving this
// page (`prepaidOf(account, gateway)`: a balance pays one gateway only), what this gateway holds
// against it (questions in flight + fees charged, not yet debited), a pending withdrawal and when
// it opens (chain time), and the four transactions, each for this gateway: add funds
// (`depositBalance`), request / cancel a withdrawal, withdraw once it is open.
import { parseEther } from "ethers";
import { loadPrepaid } from "./api.js";
import { explain } from "./errors.js";
import { $, eth, toast, weiAndEth } from "./view.js";

const MAX_BALANCE = (1n << 128n) - 1n; // QueryEscrow keeps a balance in a uint128

// {balance, withdrawableAt, held, available, now}: all bigint (wei, unix seconds of the chain).
export async function readPrepaid(wallet) {
  const escrow = await wallet.escrow();
  const [account, holding, now] = await Promise.all([
    escrow.prepaidOf(wallet.account, wallet.gateway),
    loadPrepaid(wallet.account),
    wallet.chainTime(),
  ]);
  const balance = BigInt(account.balance);
  const held = BigInt(holding.held_wei);
  const available = balance > held ? balance - held : 0n;
  return { balance, withdrawableAt: BigInt(account.withdrawableAt), held, available, now };
}

// The amount typed in ETH ("0.01") as wei, or a plain-words reason it is not one.
export function parseAmount(text) {
  const clean = String(text).trim();
  if (!/^[0-9]{1,12}(\.[0-9]{1,18})?$/.test(clean)) {
    return { error: "Enter an amount in ETH, for example 0.01." };
  }
  const wei = parseEther(clean);
  if (wei === 0n) return { error: "Enter an amount above zero." };
  if (wei > MAX_BALANCE) return { error: "That is more than a prepaid balance can hold." };
  return { wei };
}

export function withdrawalText(info) {
  if (info.withdrawableAt === 0n) return "none pending";
  if (info.now >= info.withdrawableAt) {
    return `open now: withdraw ${eth(info.balance)} to your account`;
  }
  const minutes = Math.ceil(Number(info.withdrawableAt - info.now) / 60);
  const at = new Date(Number(info.withdrawableAt) * 1000).toISOString().replace(".000Z", "Z");
  return (
    `requested: opens at ${at} (chain time, in about ${minutes} min); until then the gateway ` +
    "accepts no voucher from this balance"
  );
}

export class PrepaidCard {
  // wallet: Wallet; notify(text): shows a notice; onChange(): after each transaction.
  constructor(wallet, notify, onChange) {
    this.wallet = wallet;
    this.notify = notify;
    this.onChange = onChange;
    this.info = null;
    this.busy = false;
    $("fund").addEventListener("click", () => this.addFunds());
    $("withdraw-request").addEventListener("click", () =>
      this.send("Withdrawal request", "Requesting the withdrawal", (e) =>
        e.requestWithdrawal(wallet.gateway),
      ),
    );
    $("withdraw-cancel").addEventListener("click", () =>
      this.send("Withdrawal cancel", "Cancelling the withdrawal", (e) =>
        e.cancelWithdrawal(wallet.gateway),
      ),
    );
    $("withdraw").addEventListener("click", () =>
      this.send("Withdrawal", "Withdrawing the balance", (e) => e.withdrawBalance(wallet.gateway)),
    );
  }

  async refresh() {
    const wallet = this.wallet;
    if (!wallet.account || !wallet.onRightChain) {
      $("prepaid-card").hidden = true;
      return null;
    }
    $("prepaid-card").hidden = false;
    try {
      this.info = await readPrepaid(wallet);
    } catch (error) {
      $("p-balance").textContent = explain(error, "reading the prepaid balance failed").text;
      return null;
    }
    this.render();
    return this.info;
  }

  render() {
    const info = this.info;
    $("p-gateway").textContent = this.wallet.gateway;
    $("p-balance").textContent = weiAndEth(info.balance);
    $("p-balance").dataset.wei = info.balance.toString();
    $("p-held").textContent = weiAndEth(info.held);
    $("p-held").dataset.wei = info.held.toString();
    $("p-available").textContent =
      info.withdrawableAt === 0n ? weiAndEth(info.available) : "none while a withdrawal is pending";
    $("p-withdrawal").textContent = withdrawalText(info);
    $("p-withdrawal").dataset.at = info.withdrawableAt.toString();
    const pending = info.withdrawableAt !== 0n;
    const open = pending && info.now >= info.withdrawableAt;
    $("withdraw-request").hidden = pending;
    $("withdraw-request").disabled = this.busy || info.balance === 0n;
    $("withdraw-cancel").hidden = !pending;
    $("withdraw-cancel").disabled = this.busy;
    $("withdraw").hidden = !pending;
    $("withdraw").disabled = this.busy || !open;
    $("withdraw").title = open ? "" : "opens once the refund timeout has passed";
    $("fund").disabled = this.busy;
  }

  async addFunds() {
    const amount = parseAmount($("fund-amount").value);
    if (amount.error) {
      this.notify(amount.error);
      $("fund-amount").focus();
      return;
    }
    const have = await this.wallet.balance().catch(() => null);
    if (have !== null && have <= amount.wei) {
      this.notify(
        `Insufficient funds: adding ${weiAndEth(amount.wei)} needs that plus gas, but your ` +
          `account holds ${eth(have)}. Fund the account and try again.`,
      );
      return;
    }
    await this.send("Funds", "Adding funds", (e) =>
      e.depositBalance(this.wallet.gateway, { value: amount.wei }),
    );
  }

  // label: the toasts ("Funds sent", "Funds confirmed in block N"); context: the error prefix.
  async send(label, context, call) {
    this.busy = true;
    if (this.info) this.render();
    try {
      const escrow = await this.wallet.escrow();
      const tx = await call(escrow);
      toast(`${label} sent`, tx.hash);
      const mined = await tx.wait();
      toast(`${label} confirmed in block ${mined.blockNumber}`, tx.hash);
    } catch (error) {
      this.notify(explain(error, `${context} did not go through`).text);
    } finally {
      this.busy = false;
      await this.refresh();
      await this.onChange();
    }
  }
}
