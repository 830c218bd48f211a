// The browser wallet (EIP-1193, window.ethereum) through ethers' BrowserProvider: connect, the
// chain check and switch, the balance, the escrow contract bound to the user's signer, and the
// gateway serving the page (every deposit and prepaid balance is bound to it).
import { BrowserProvider, Contract } from "ethers";

export class Wallet {
  constructor(ethereum, config) {
    this.ethereum = ethereum;
    this.config = config;
    this.account = null;
    this.chainId = null;
    this.provider = new BrowserProvider(ethereum, "any");
  }

  get onRightChain() {
    return this.chainId === this.config.chain_id;
  }

  // The address of the gateway serving this page: the only one that may spend what is paid here.
  get gateway() {
    return this.config.gateway;
  }

  async connect() {
    const accounts = await this.ethereum.request({ method: "eth_requestAccounts" });
    this.account = accounts && accounts.length ? accounts[0] : null;
    await this.readChain();
    return this.account;
  }

  async readChain() {
    const hex = await this.ethereum.request({ method: "eth_chainId" });
    this.chainId = Number(BigInt(hex));
    this.provider = new BrowserProvider(this.ethereum, "any");
    return this.chainId;
  }

  async switchChain() {
    const chainId = `0x${this.config.chain_id.toString(16)}`;
    try {
      await this.ethereum.request({ method: "wallet_switchEthereumChain", params: [{ chainId }] });
    } catch (error) {
      if (error && error.code === 4902 && this.config.evm_rpc) {
        // The wallet does not know this chain yet: offer to add it, then it switches.
        await this.ethereum.request({
          method: "wallet_addEthereumChain",
          params: [
            {
              chainId,
              chainName: this.config.chain_name,
              rpcUrls: [this.config.evm_rpc],
              nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
            },
          ],
        });
      } else {
        throw error;
      }
    }
    return this.readChain();
  }

  async balance() {
    return this.provider.getBalance(this.account);
  }

  async escrow() {
    const signer = await this.provider.getSigner(this.account);
    return new Contract(this.config.escrow, this.config.escrow_abi, signer);
  }

  async chainTime() {
    const block = await this.provider.getBlock("latest");
    return BigInt(block.timestamp);
  }

  on(event, handler) {
    if (typeof this.ethereum.on === "function") this.ethereum.on(event, handler);
  }
}
