// A test wallet behind an injected EIP-1193 provider: the page's `window.ethereum.request`
// goes through a Playwright binding to this Node object, which answers account/chain
// questions itself, signs transactions and EIP-712 data with a devnet key (ethers Wallet), and
// forwards everything else to the real anvil JSON-RPC.
import { JsonRpcProvider, Wallet } from "ethers";

export const INIT_SCRIPT = `(() => {
  const listeners = {};
  window.ethereum = {
    isPlanetTestWallet: true,
    async request({ method, params }) {
      const answer = JSON.parse(
        await window.__planetWallet(JSON.stringify({ method, params: params || [] })),
      );
      if (answer.error) {
        const error = new Error(answer.error.message);
        error.code = answer.error.code;
        if (answer.error.data !== undefined) error.data = answer.error.data;
        throw error;
      }
      return answer.result;
    },
    on(event, handler) { (listeners[event] = listeners[event] || []).push(handler); },
    removeListener(event, handler) {
      listeners[event] = (listeners[event] || []).filter((h) => h !== handler);
    },
  };
  window.__planetEmit = (event, value) => (listeners[event] || []).forEach((h) => h(value));
})();`;

export class TestWallet {
  // options: {rpc, chainId, privateKey, reportChainId (what eth_chainId says first),
  //           rejectSignatures (answer 4001 to eth_signTypedData_v4)}
  constructor(options) {
    this.rpc = options.rpc;
    this.chainId = options.chainId;
    this.reported = options.reportChainId ?? options.chainId;
    this.rejectSignatures = Boolean(options.rejectSignatures);
    this.provider = new JsonRpcProvider(options.rpc, options.chainId, { staticNetwork: true });
    this.signer = new Wallet(options.privateKey, this.provider);
    this.calls = [];
    this.page = null;
    this.nextId = 1;
  }

  get address() {
    return this.signer.address;
  }

  async install(context) {
    await context.exposeBinding("__planetWallet", async (_source, payload) => {
      const { method, params } = JSON.parse(payload);
      this.calls.push(method);
      try {
        return JSON.stringify({ result: await this.handle(method, params) });
      } catch (error) {
        const code = typeof error.code === "number" ? error.code : -32603;
        const data = error.data === undefined ? undefined : error.data;
        return JSON.stringify({ error: { code, message: String(error.message || error), data } });
      }
    });
    await context.addInitScript(INIT_SCRIPT);
  }

  async handle(method, params) {
    switch (method) {
      case "eth_requestAccounts":
      case "eth_accounts":
        return [this.address];
      case "eth_chainId":
        return `0x${this.reported.toString(16)}`;
      case "net_version":
        return String(this.reported);
      case "wallet_switchEthereumChain": {
        const wanted = Number(BigInt(params[0].chainId));
        if (wanted !== this.chainId) throw rpcError(4902, `unknown chain ${wanted}`);
        this.reported = wanted;
        const page = this.page;
        if (page) {
          setTimeout(() => {
            page.evaluate((id) => window.__planetEmit("chainChanged", id), params[0].chainId)
              .catch(() => {});
          }, 0);
        }
        return null;
      }
      case "eth_sendTransaction":
        return this.send(params[0]);
      case "eth_signTypedData_v4":
        return this.signTyped(params);
      default:
        return this.forward(method, params);
    }
  }

  async send(tx) {
    if (this.reported !== this.chainId) throw rpcError(4901, "the wallet is on another chain");
    const request = { to: tx.to, data: tx.data, value: tx.value ? BigInt(tx.value) : 0n };
    if (tx.gas) request.gasLimit = BigInt(tx.gas);
    // The nonce straight from anvil (not ethers' provider, which answers a repeated
    // eth_getTransactionCount from a 250 ms cache: two quick transactions would share a nonce).
    const count = await this.forward("eth_getTransactionCount", [this.address, "pending"]);
    request.nonce = Number(BigInt(count));
    const balance = await this.provider.getBalance(this.address);
    if (balance < request.value) {
      throw rpcError(-32000, "insufficient funds for gas * price + value");
    }
    try {
      const sent = await this.signer.sendTransaction(request);
      return sent.hash;
    } catch (error) {
      const inner = error.info && error.info.error ? error.info.error : error;
      throw rpcError(typeof inner.code === "number" ? inner.code : -32000, inner.message);
    }
  }

  async signTyped(params) {
    if (this.rejectSignatures) throw rpcError(4001, "User rejected the request.");
    const [address, json] = params;
    if (address.toLowerCase() !== this.address.toLowerCase()) {
      throw rpcError(4100, `not this wallet's account: ${address}`);
    }
    const typed = typeof json === "string" ? JSON.parse(json) : json;
    const types = { ...typed.types };
    delete types.EIP712Domain;
    return this.signer.signTypedData(typed.domain, types, typed.message);
  }

  async forward(method, params) {
    const response = await fetch(this.rpc, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: this.nextId++, method, params }),
    });
    const body = await response.json();
    if (body.error) {
      const error = rpcError(body.error.code, body.error.message);
      error.data = body.error.data;
      throw error;
    }
    return body.result;
  }
}

function rpcError(code, message) {
  const error = new Error(message);
  error.code = code;
  return error;
}
