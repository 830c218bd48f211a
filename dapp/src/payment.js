// Paying for one question: the deposit amount, a fresh query id, the EIP-712 QueryPayment the
// depositor signs (the API key) or the Voucher a prepaid payer signs (the voucher key), and the
// client-side check of the gateway's signed receipt. Mirrors protocol/payment.py (same type
// strings, same key grammars).
import { concat, getBytes, hexlify, keccak256, verifyTypedData } from "ethers";

export const QUERY_PAYMENT_TYPES = {
  QueryPayment: [
    { name: "queryId", type: "bytes32" },
    { name: "modelId", type: "bytes32" },
    { name: "gateway", type: "address" },
    { name: "feeCap", type: "uint256" },
  ],
};

// Voucher(address gateway,bytes32 queryId,bytes32 modelId,uint256 feeCap,uint64 expiry,
//         address consumer) — same domain as QueryPayment; consumer = the QueryEscrow.
export const VOUCHER_TYPES = {
  Voucher: [
    { name: "gateway", type: "address" },
    { name: "queryId", type: "bytes32" },
    { name: "modelId", type: "bytes32" },
    { name: "feeCap", type: "uint256" },
    { name: "expiry", type: "uint64" },
    { name: "consumer", type: "address" },
  ],
};

export const VOUCHER_TTL_S = 600; // a voucher is good for 10 minutes (as `planet ask --voucher`)

export const RECEIPT_TYPES = {
  Receipt: [
    { name: "queryId", type: "bytes32" },
    { name: "gateway", type: "address" },
    { name: "modelId", type: "bytes32" },
    { name: "promptTokens", type: "uint32" },
    { name: "completionTokens", type: "uint32" },
    { name: "fee", type: "uint256" },
    { name: "circuitHash", type: "bytes32" },
  ],
};

const MAX_DEPOSIT = (1n << 64n) - 1n; // QueryEscrow keeps a deposit in a uint64
const TEMPLATE_TOKENS = 64n; // the chat template adds fewer tokens than this

// price × (prompt bytes + template + max tokens): a byte-level tokenizer never makes more
// tokens than bytes, so this always covers what the gateway checks (as `planet ask --pay`).
export function depositFor(question, maxTokens, priceWeiPerToken) {
  const bytes = BigInt(new TextEncoder().encode(question).length);
  const amount = BigInt(priceWeiPerToken) * (bytes + TEMPLATE_TOKENS + BigInt(maxTokens));
  if (amount > MAX_DEPOSIT) throw new RangeError("the question is too long for one deposit");
  return amount;
}

export function newQueryId() {
  return hexlify(crypto.getRandomValues(new Uint8Array(32)));
}

// `modelId`: the escrow's id of the model asked (a pool's `model_id`; default the first model's).
export function paymentMessage(queryId, config, feeCap, modelId = config.model_id) {
  return { queryId, modelId, gateway: config.gateway, feeCap: feeCap.toString() };
}

// planet-pay-v1.<query id: 64 hex>.<fee cap: decimal wei>.<signature: 130 hex>
export function apiKey(queryId, feeCap, signature) {
  const hex = (value) => hexlify(getBytes(value)).slice(2).toLowerCase();
  return `planet-pay-v1.${hex(queryId)}.${feeCap.toString()}.${hex(signature)}`;
}

// Expiry of a voucher signed now: unix seconds of the wall clock (the gateway checks it against
// its own clock) plus the TTL, never beyond the gateway's accepted lifetime.
export function voucherExpiry(nowMs, config, ttl = VOUCHER_TTL_S) {
  const lifetime = Number(config.max_voucher_lifetime_s || ttl);
  return BigInt(Math.floor(nowMs / 1000) + Math.min(ttl, lifetime));
}

export function voucherMessage(queryId, config, feeCap, expiry, modelId = config.model_id) {
  return {
    gateway: config.gateway,
    queryId,
    modelId,
    feeCap: feeCap.toString(),
    expiry: expiry.toString(),
    consumer: config.payment_domain.verifyingContract,
  };
}

// planet-voucher-v1.<query id: 64 hex>.<fee cap: decimal wei>.<expiry: decimal s>.<sig: 130 hex>
export function voucherKey(queryId, feeCap, expiry, signature) {
  const hex = (value) => hexlify(getBytes(value)).slice(2).toLowerCase();
  const fields = [hex(queryId), feeCap.toString(), expiry.toString(), hex(signature)];
  return `planet-voucher-v1.${fields.join(".")}`;
}

// {signer, signatureOk, circuitOk}: who signed the receipt, whether that is the gateway, and
// whether circuit_hash = keccak256(node keys).
export function checkReceipt(receipt, config) {
  const value = {
    queryId: receipt.query_id,
    gateway: receipt.gateway,
    modelId: receipt.model_id,
    promptTokens: receipt.prompt_tokens,
    completionTokens: receipt.completion_tokens,
    fee: receipt.fee_wei,
    circuitHash: receipt.circuit_hash,
  };
  let signer = null;
  try {
    signer = verifyTypedData(config.payment_domain, RECEIPT_TYPES, value, receipt.signature);
  } catch {
    signer = null;
  }
  const keys = (receipt.nodes || []).map((key) => `0x${key}`);
  const circuitOk = keys.length > 0 && keccak256(concat(keys)) === receipt.circuit_hash;
  const signatureOk =
    signer !== null && signer.toLowerCase() === String(config.gateway).toLowerCase();
  return { signer, signatureOk, circuitOk };
}
