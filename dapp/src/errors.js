// Errors in plain words: what happened and what the user can do. Returns {text, action?} where
// action names a button the page offers ("switch").
import { GatewayError, UnreachableError } from "./api.js";

function rpcCode(error) {
  for (let e = error, depth = 0; e && depth < 5; depth += 1) {
    if (typeof e.code === "number") return e.code;
    e = e.info && e.info.error ? e.info.error : e.error;
  }
  return null;
}

function messageOf(error) {
  const parts = [];
  for (let e = error, depth = 0; e && depth < 5; depth += 1) {
    if (e.shortMessage) parts.push(e.shortMessage);
    if (e.message) parts.push(e.message);
    e = e.info && e.info.error ? e.info.error : e.error;
  }
  return parts.join(" ").toLowerCase();
}

const ESCROW_REVERTS = {
  RefundNotYetAvailable: "The refund is not available yet: the refund timeout has not passed.",
  NothingToRefund: "This deposit holds nothing more to refund.",
  NotDepositor: "Only the account that paid for this question can refund it.",
  QueryExists: "This query id was already used; try again (a new id is drawn each time).",
  InvalidDepositAmount: "The escrow does not accept a deposit of this size.",
  BalanceOverflow: "The prepaid balance cannot hold that much more.",
  NothingToWithdraw: "Your prepaid balance is empty: there is nothing to withdraw.",
  WithdrawalAlreadyRequested: "A withdrawal of your prepaid balance is already pending.",
  WithdrawalNotRequested: "No withdrawal is pending: request one first.",
  WithdrawalNotYetAvailable:
    "The withdrawal is not open yet: it opens once the refund timeout has passed on the chain.",
};

const GATEWAY_CODES = {
  payment_unfunded: "The gateway sees no deposit for this question yet.",
  payment_underfunded: "The deposit is too small for this question and answer length.",
  payment_closed: "This deposit was already settled or refunded.",
  payment_squatted: "The payment was not signed by the account that made the deposit.",
  payment_used: "This payment was already used for another answer.",
  payment_wrong_model: "The deposit was made for another model.",
  payment_malformed: "The payment proof was not accepted.",
  payment_expiring: "The deposit's refund opens too soon for the gateway to be paid; ask again.",
  payment_wrong_gateway:
    "This deposit pays another gateway: ask that gateway, or refund it after the timeout.",
};

// The prepaid path (a voucher charged to the balance): what went wrong and what to do.
const PREPAID_CODES = {
  voucher_malformed: "The gateway could not read the voucher; reload the page and ask again.",
  voucher_expired:
    "The voucher expired before the gateway got it; ask again (a new one is signed).",
  voucher_expiring:
    "The voucher expires too soon for the committee to charge it after the answer; " +
    "check your computer's clock and ask again.",
  voucher_expiry_too_far:
    "The voucher's expiry is further away than this gateway accepts; check your computer's clock.",
  voucher_over_cap:
    "The voucher's limit is lower than this question may cost; ask again " +
    "(the limit follows the question's length).",
  voucher_replayed: "This voucher was already used; ask again (each question signs a new one).",
  voucher_invalid: "The voucher's signature was not valid for this gateway; sign again.",
  balance_withdrawing:
    "Your prepaid balance is being withdrawn, so the gateway does not accept vouchers from it. " +
    "Cancel the withdrawal or pay per question.",
  balance_insufficient:
    "Your prepaid balance (minus what the gateway already holds for your recent questions) " +
    "does not cover this question. Add funds or pay per question.",
  key_malformed: "The gateway could not read the payment key; create a new one (planet key new).",
  key_invalid: "The payment key's signature is not valid for this gateway; create a new one.",
  key_revoked: "This payment key was revoked; create a new one (planet key new).",
  key_exhausted: "This payment key's spending cap is used up; create a new one with a higher cap.",
  key_unfunded:
    "The account behind this payment key has no prepaid balance with this gateway; add funds.",
};

// `prepaid`: the question was paid by a voucher (nothing to refund: an unanswered question is
// not charged to the balance).
export function explain(error, context = "", { prepaid = false } = {}) {
  const prefix = context ? `${context}: ` : "";
  const after = prepaid
    ? "your prepaid balance is not charged for it."
    : "the deposit can be refunded after the timeout.";
  if (error instanceof UnreachableError) {
    return {
      text:
        `${prefix}the gateway does not answer. Check that it is running ` +
        "(planet devnet status) and reload the page.",
    };
  }
  if (error instanceof GatewayError) {
    if (error.status === 402 && PREPAID_CODES[error.code]) {
      return {
        text:
          `${prefix}the prepaid balance did not pay. ` +
          `${PREPAID_CODES[error.code]} (${error.message})`,
      };
    }
    if (error.status === 402) {
      const plain = GATEWAY_CODES[error.code] || "The gateway did not accept the payment.";
      return { text: `${prefix}unpaid or underfunded question. ${plain} (${error.message})` };
    }
    if (error.code === "model_not_found") {
      return {
        text:
          `${prefix}this gateway does not serve that model (${error.message}). Pick one of ` +
          `the models under “Model pool”. You were not charged; ${after}`,
      };
    }
    if (error.code === "no_routable_node") {
      return {
        text:
          `${prefix}the pool is incomplete: ${error.message}. You were not charged; ${after}`,
      };
    }
    if (error.code === "chain_busy") {
      return {
        text: `${prefix}the gateway is busy reading the chain; ask again in a moment. ${after}`,
      };
    }
    if (error.code === "committee_unavailable" || error.code === "chain_unavailable") {
      return { text: `${prefix}the network behind the gateway does not answer: ${error.message}` };
    }
    if (error.status === 502) {
      return {
        text:
          `${prefix}a compute node failed while answering (${error.message}). You were not ` +
          `charged; ${after}`,
      };
    }
    return { text: `${prefix}the gateway refused: ${error.message}` };
  }
  const code = rpcCode(error);
  const words = messageOf(error);
  if (code === 4001 || (error && error.code === "ACTION_REJECTED")) {
    return { text: `${prefix}you declined the request in your wallet.` };
  }
  if (code === 4902) {
    return { text: `${prefix}your wallet does not know this network; add it and try again.` };
  }
  if ((error && error.code === "INSUFFICIENT_FUNDS") || words.includes("insufficient funds")) {
    return {
      text: `${prefix}insufficient funds: this account does not hold enough ETH for the amount and gas.`,
    };
  }
  const revert = error && error.revert && error.revert.name;
  if (revert && ESCROW_REVERTS[revert]) return { text: `${prefix}${ESCROW_REVERTS[revert]}` };
  if (error && error.code === "NETWORK_ERROR") {
    return { text: `${prefix}the wallet's network changed or does not answer; try again.` };
  }
  const short = (error && (error.shortMessage || error.message)) || String(error);
  return { text: `${prefix}${short}` };
}
