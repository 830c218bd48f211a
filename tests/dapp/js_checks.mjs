// The dApp's pure modules run in Node (no browser): the payment proof it builds and how it
// words errors. Prints one JSON object; tests/dapp/test_dapp_js.py checks it against
// protocol/payment.py (the gateway's parser and signature recovery).
import { Wallet } from "ethers";
import { GatewayError, UnreachableError } from "../../dapp/src/api.js";
import { explain } from "../../dapp/src/errors.js";
import {
  QUERY_PAYMENT_TYPES,
  apiKey,
  checkReceipt,
  depositFor,
  newQueryId,
  paymentMessage,
} from "../../dapp/src/payment.js";

const input = JSON.parse(process.env.DAPP_JS_INPUT);
const wallet = new Wallet(input.private_key);
const config = input.config;
const queryId = newQueryId();
const feeCap = depositFor("Grüße, world?", 16, config.price_wei_per_token);
const signature = await wallet.signTypedData(
  config.payment_domain,
  QUERY_PAYMENT_TYPES,
  paymentMessage(queryId, config, feeCap),
);

const rejected = Object.assign(new Error("User rejected the request."), { code: 4001 });
const wrapped = { code: "UNKNOWN_ERROR", info: { error: { code: 4001, message: "no" } } };
const poor = Object.assign(new Error("insufficient funds for gas * price + value"), { code: -32000 });
const revert = { code: "CALL_EXCEPTION", revert: { name: "RefundNotYetAvailable" } };
const words = {};
for (const [name, error] of Object.entries({
  rejected,
  wrapped,
  poor,
  revert,
  unreachable: new UnreachableError("The gateway"),
  underfunded: new GatewayError(402, "payment_underfunded", "needs 5 wei, the cap is 4"),
  unfunded: new GatewayError(402, "payment_unfunded", "no deposit"),
  incomplete: new GatewayError(503, "no_routable_node", "no routable compute node serves shard 1"),
  node_failed: new GatewayError(502, "node_failed", "node x failed"),
})) {
  words[name] = explain(error, "Context").text;
}

const receiptSigner = input.receipt ? checkReceipt(input.receipt, config) : null;
let tooLong = null;
try {
  depositFor("x".repeat(100), 16, (1n << 60n).toString());
} catch (error) {
  tooLong = error.message;
}
process.stdout.write(
  JSON.stringify({
    address: wallet.address,
    query_id: queryId,
    fee_cap: feeCap.toString(),
    key: apiKey(queryId, feeCap, signature),
    words,
    receipt: receiptSigner,
    too_long: tooLong,
  }) + "\n",
);
