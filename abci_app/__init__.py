"""The committee chain: an ABCI 2.0 application behind real CometBFT validators."""
