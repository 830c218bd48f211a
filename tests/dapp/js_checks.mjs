// The dApp's pure modules run in Node (no browser): the payment proof it builds (for the first
// model and for a second one), how it words errors, and which model it asks and shows. Prints one JSON object; tests/dapp/test_dapp_js.py checks it against
// protocol/payment.py (the gateway's parser and signature recovery).
import { TypedDataEncoder, Wallet } from "ethers";
import { GatewayError, UnreachableError } from "../../dapp/src/api.js";
import { explain } from "../../dapp/src/errors.js";
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
} from "../../dapp/src/payment.js";
import {
  answeredBy,
  initialModel,
  modelRows,
  selectedPool,
  shortHash,
} from "../../dapp/src/models.js";
import { parseAmount, withdrawalText } from "../../dapp/src/prepaid.js";

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

// A voucher over fixed values (the golden test signs the same in Python: RFC 6979 signatures
// are deterministic, so the keys must be equal byte for byte).
const golden = input.voucher;
const voucherSignature = await wallet.signTypedData(
  config.payment_domain,
  VOUCHER_TYPES,
  voucherMessage(golden.query_id, config, BigInt(golden.fee_cap), BigInt(golden.expiry)),
);
const voucher = {
  type_string: TypedDataEncoder.from(VOUCHER_TYPES).encodeType("Voucher"),
  key: voucherKey(golden.query_id, BigInt(golden.fee_cap), BigInt(golden.expiry), voucherSignature),
  expiry_default: voucherExpiry(1_700_000_000_123, { max_voucher_lifetime_s: 86_400 }).toString(),
  expiry_short_lifetime: voucherExpiry(1_700_000_000_123, { max_voucher_lifetime_s: 60 }).toString(),
};
const amounts = {};
for (const text of ["0.01", " 1 ", "0", "-1", "1e18", "0.0000000000000000001", "abc", ""]) {
  const parsed = parseAmount(text);
  amounts[text] = parsed.error ? { error: parsed.error } : { wei: parsed.wei.toString() };
}
const withdrawal = {
  none: withdrawalText({ withdrawableAt: 0n, now: 100n, balance: 5n }),
  waiting: withdrawalText({ withdrawableAt: 1_700_000_600n, now: 1_700_000_000n, balance: 5n }),
  open: withdrawalText({ withdrawableAt: 100n, now: 100n, balance: 10n ** 16n }),
};

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
  withdraw_early: { code: "CALL_EXCEPTION", revert: { name: "WithdrawalNotYetAvailable" } },
})) {
  words[name] = explain(error, "Context").text;
}
for (const code of [
  "voucher_malformed",
  "voucher_expired",
  "voucher_expiry_too_far",
  "voucher_over_cap",
  "voucher_replayed",
  "voucher_invalid",
  "balance_withdrawing",
  "balance_insufficient",
]) {
  words[code] = explain(new GatewayError(402, code, `gateway says ${code}`), "Context").text;
}
words.node_failed_prepaid = explain(new GatewayError(502, "node_failed", "node x failed"), "Context", {
  prepaid: true,
}).text;

words.model_not_found = explain(
  new GatewayError(404, "model_not_found", "the model 'llama' is not served here"),
  "No answer",
).text;

// A second model (issue 44): the same payments, signed for its own model id.
const second = input.second_model_id;
const secondFeeCap = depositFor("Grüße, world?", 16, config.price_wei_per_token);
const secondPayment = await wallet.signTypedData(
  config.payment_domain,
  QUERY_PAYMENT_TYPES,
  paymentMessage(queryId, config, secondFeeCap, second),
);
const secondVoucher = await wallet.signTypedData(
  config.payment_domain,
  VOUCHER_TYPES,
  voucherMessage(golden.query_id, config, BigInt(golden.fee_cap), BigInt(golden.expiry), second),
);
const pools = input.pools;
const asked = pools[1];
const models = {
  initial: Object.fromEntries(
    Object.entries({
      none: null,
      second: pools[1].model,
      by_hash: pools[1].model_hash,
      padded: ` ${pools[1].model} `,
      unknown: "llama-70b",
      empty: "  ",
      long: "x".repeat(500),
    }).map(([name, wanted]) => [name, initialModel(pools, wanted)]),
  ),
  initial_no_pools: initialModel([], "x"),
  selected_second: selectedPool(pools, pools[1].model).model,
  selected_gone: selectedPool(pools, "gone").model,
  selected_none: selectedPool([], "gone"),
  rows: modelRows({
    model: pools[1].model,
    models: pools.map((pool) => ({
      ...pool,
      pool: { status: pool.status, routable_per_shard: pool.routable_per_shard },
    })),
  }),
  rows_none: modelRows({}),
  short_hashes: ["sha256:" + "ab".repeat(32), "sha256:abcd", "", "plain-name-longer"].map(shortHash),
  answered: {
    ok: answeredBy(asked, asked.model, { model_id: asked.model_id.toUpperCase().replace("0X", "0x") }),
    no_receipt: answeredBy(asked, asked.model, null),
    other_name: answeredBy(asked, pools[0].model, null),
    other_id: answeredBy(asked, asked.model, { model_id: pools[0].model_id }),
    unnamed: answeredBy(asked, null, null),
  },
};

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
    voucher,
    amounts,
    withdrawal,
    second: {
      key: apiKey(queryId, secondFeeCap, secondPayment),
      voucher_key: voucherKey(
        golden.query_id,
        BigInt(golden.fee_cap),
        BigInt(golden.expiry),
        secondVoucher,
      ),
    },
    models,
  }) + "\n",
);
