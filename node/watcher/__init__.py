"""The stake watcher: a validator reads the Staking contract and attests stakes on the committee."""
