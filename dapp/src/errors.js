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
};

const GATEWAY_CODES = {
  payment_unfunded: "The gateway sees no deposit for this question yet.",
  payment_underfunded: "The deposit is too small for this question and answer length.",
  payment_closed: "This deposit was already settled or refunded.",
  payment_squatted: "The payment was not signed by the account that made the deposit.",
  payment_used: "This payment was already used for another answer.",
  payment_wrong_model: "The deposit was made for another model.",
  payment_malformed: "The payment proof was not accepted.",
};

export function explain(error, context = "") {
  const prefix = context ? `${context}: ` : "";
  if (error instanceof UnreachableError) {
    return {
      text:
        `${prefix}the gateway does not answer. Check that it is running ` +
        "(planet devnet status) and reload the page.",
    };
  }
  if (error instanceof GatewayError) {
    if (error.status === 402) {
      const plain = GATEWAY_CODES[error.code] || "The gateway did not accept the payment.";
      return { text: `${prefix}unpaid or underfunded question. ${plain} (${error.message})` };
    }
    if (error.code === "no_routable_node") {
      return {
        text:
          `${prefix}the pool is incomplete: ${error.message}. You were not charged; ` +
          "the deposit can be refunded after the timeout.",
      };
    }
    if (error.code === "committee_unavailable" || error.code === "chain_unavailable") {
      return { text: `${prefix}the network behind the gateway does not answer: ${error.message}` };
    }
    if (error.status === 502) {
      return {
        text:
          `${prefix}a compute node failed while answering (${error.message}). You were not ` +
          "charged; the deposit can be refunded after the timeout.",
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
      text: `${prefix}insufficient funds: this account does not hold enough ETH for the deposit and gas.`,
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
