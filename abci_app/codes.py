"""Every ABCI result code the committee app returns, named in one place (codespace "planet").

CheckTx / FinalizeBlock tx results and Query answers use these; 0 is success. Codes are part
of the chain's observable behaviour (clients branch on them): never renumber, only append.
"""

from __future__ import annotations

from enum import IntEnum

CODESPACE = "planet"


class Code(IntEnum):
    OK = 0
    # decoding and authentication (CheckTx rejects these)
    MALFORMED_TX = 1
    BAD_SIGNATURE = 2
    BAD_NONCE = 3
    BAD_EVM_SIGNATURE = 4
    RESERVED_TX = 5  # the vote-extension tx may only be injected by a proposer
    # state rules (FinalizeBlock)
    UNKNOWN_NODE = 10
    ALREADY_REGISTERED = 11
    EVM_ADDRESS_TAKEN = 12
    WRONG_ROLE = 13
    NOT_VALIDATOR = 14
    INVALID_LIFECYCLE = 15
    DUPLICATE_COMMITMENT = 16
    UNKNOWN_COMMITMENT = 17
    ALREADY_REVEALED = 18
    # 19: BAD_SHARE_BLOCK of the retired share_block tx (never reuse)
    BAD_VERDICT_SIGNATURE = 20
    DUPLICATE_VOTE = 21
    VERDICTS_DISABLED = 22
    BAD_VOTE_EXTENSIONS = 23
    # verifier seeds (abci_app/seeds.py)
    SEED_NOT_IN_FUTURE = 24  # seed_commit for an epoch that has already started
    DUPLICATE_SEED = 25  # this validator already committed a seed for that epoch
    UNKNOWN_SEED = 26  # seed_reveal without a commitment
    SEED_NOT_CLOSED = 27  # seed_reveal before that epoch closed
    SEED_MISMATCH = 28  # the revealed seed does not open the commitment
    # settlement (abci_app/settlement.py); numbered from 30 to leave 24-29 to other tx types
    UNKNOWN_GATEWAY = 30  # work_report by a key not bound by a gateway tx
    # 31: UNBACKED_CONTRIBUTION of the retired contribution tx (never reuse)
    DUPLICATE_QUERY = 32  # a query id already reported with another fee (same fee: no-op)
    NO_STATEMENT = 33  # payout_vote for an epoch without a stored statement
    BAD_PAYOUT_SIGNATURE = 34  # not the validator operator's signature over the statement
    SETTLEMENT_DISABLED = 35  # genesis has no evm.escrow_address
    # charge items of work_report (abci_app/settlement.py): refused items, not whole txs
    AUTHORIZATION_INVALID = 36  # the voucher / key does not recover to its payer
    AUTHORIZATION_EXPIRED = 37  # the authorization expired before the block that carries it
    CHARGE_BELOW_PREVIOUS = 38  # a total lower than what was charged under it before
    AUTHORIZATION_EXPIRY_TOO_FAR = 39  # expiry beyond block time + the kind's longest lifetime
    # spot-check reports (abci_app/spot_reports.py); 50+ to leave room to settlement
    SPOT_REPORT_EPOCH = 50  # the epoch is not closed yet, or too old to report
    DUPLICATE_SPOT_REPORT = 51  # this validator already reported that epoch
    SPOT_CHECK_NOT_ASSIGNED = 52  # a listed triple was not committed then, selected, or assigned
    # coverage and verifier standing (abci_app/coverage.py, abci_app/verdicts.py)
    # 53: UNCOMMITTED_CONTRIBUTION of the retired contribution tx (never reuse)
    VERIFIER_BENCHED = 54  # the validator's verifier is benched for a false accusation
    # more charge-item refusals (abci_app/settlement.py)
    CHARGE_OVER_CAP = 60  # a total above the authorization's cap
    WRONG_GATEWAY = 61  # a charge names another gateway than the key's bound one, or the escrow
    # gateway bindings (abci_app/gateway_bindings.py)
    GATEWAY_BINDING_INVALID = 62  # the address's signature does not recover to it (or no domain)
    GATEWAY_BINDING_REPLAYED = 63  # a nonce not above the address's last binding nonce
    GATEWAY_ALREADY_BOUND = 64  # the key or the address is bound elsewhere: release it first
    GATEWAY_NOT_BOUND = 65  # a release of a binding that does not hold
    # credits (abci_app/credits.py); 70+ to leave 53-59 and 62-69 to settlement
    CREDITS_DISABLED = 70  # genesis has no credits section (or no escrow)
    # 71-73 retired (the per-validator RSA `credit_key` tx is gone): never reuse them
    MINT_INVALID = 74  # purchase signature not by the payer, or amount != credits x price
    MINT_REPLAYED = 75  # this mint id was minted before
    NO_CREDIT_KEYS = 76  # the key period has no committee key (its DKG is running or failed)
    CREDIT_INVALID = 77  # a credit whose signature does not verify under its period's key
    CREDIT_SPENT = 78  # a credit already redeemed (or listed twice)
    CREDIT_EPOCH = 79  # a mint of another key period, or a credit outside its window
    REDEEM_SHARD = 80  # redeem for a (model, shard) the node did not register
    MINT_UNKNOWN = 81  # fund_mint of a mint id the chain does not hold
    MINT_FUND_LATE = 82  # fund_mint after the mint's epoch + 1, or past its purchase expiry
    MINT_UNFUNDED = 83  # /credit_partials of a mint not yet vouched for by >= 2/3 of the power
    UNCOMMITTED_REDEMPTION = 84  # redeem with fewer committed, unconsumed positions than credits
    MINT_PENDING_LIMIT = 85  # the payer already holds credits.max_pending_mints unfunded mints
    CREDIT_LOCKED = 86  # a credit another node locked first (credit_lock, redeem: credit_locks.py)
    # a validator's posted partial signatures (abci_app/mint_partials.py: `mint_partials`)
    PARTIALS_INVALID = 87  # not one per blinded point, or not verifying under the signer's X_i
    PARTIALS_REPLAYED = 88  # this validator's partials for that mint are on the chain already
    MINT_SIGNING_CLOSED = 89  # partials for (or /credit_partials of) a mint past its signing
    #                           deadline: refunded, never signed again
    # prices (abci_app/prices.py); 90+ to leave 86-89 to the credit modules
    PRICE_SHARD = 90  # set_price for a (model, shard) the node did not register
    REDEMPTION_OVER_PRICE = 91  # redeem of N credits with fewer than N x price committed positions
    # the credit key periods' DKG (abci_app/credit_dkg.py); 92+ to leave 86-91 to other credit txs
    DKG_PHASE = 92  # a DKG message outside its phase's blocks, or for a period with no run
    DKG_MESSAGE_INVALID = 93  # malformed, not the signer's own index, duplicate, nothing to answer
    NOT_DKG_PARTICIPANT = 94  # the signer is not a receiver of that period's run
    # the relay registry (abci_app/registry.py: the `relay` tx)
    RELAY_KEY_TAKEN = 95  # relay with an X25519 key another registered relay holds
    RELAY_ENDPOINT_TAKEN = 96  # relay with an endpoint another registered relay holds
    # prices again (abci_app/prices.py)
    REDEMPTION_UNPRICED = 97  # redeem on a shard with no price above 0 in the creditable epochs
    # rebalancing (abci_app/registry.py: the `move_shards` tx)
    MOVE_UNCHANGED = 98  # move_shards to the shards and endpoint the node already has
    MOVE_SHARD_UNKNOWN = 100  # move_shards to a shard the node's model does not have (genesis)
    MOVE_TOO_SOON = 101  # a second move_shards within registry.MOVE_COOLDOWN_BLOCKS
    # who may lock or redeem a credit (abci_app/credit_holders.py)
    CREDIT_NOT_ASSIGNED = 102  # a credit its holder did not assign to the locking/redeeming party
    # nodes behind NAT (abci_app/registry.py: register_node's `rendezvous`)
    RENDEZVOUS_NOT_RELAY = 103  # a rendezvous entry names a key that is not a registered relay
    RENDEZVOUS_ENDPOINT = 104  # a rendezvous endpoint not at its relay's registered IP address
    # numerics (abci_app/registry.py: register_node's `numerics`, genesis `numerics`)
    NUMERICS_NOT_ACCEPTED = 105  # a register_node/set_numerics/verifier_numerics announcing
    #                              numerics its genesis does not list
    # numerics changes (abci_app/numerics.py: `set_numerics`, `verifier_numerics`)
    NUMERICS_UNCHANGED = 107  # a change to the version in effect (nothing pending) or pending
    NUMERICS_TOO_SOON = 108  # a change while one is pending or within NUMERICS_COOLDOWN_EPOCHS
    # ratifications (abci_app/ratifications.py: `verdict_ratify`)
    VERDICT_NOT_CONFIRMED = 109  # a ratification of a verdict that is unknown or not confirmed
    # validator set changes (abci_app/validator_set.py: `validator_change`, `validator_approve`)
    VALIDATOR_CHANGE_INVALID = 110  # add of a validator, power/remove of a non-validator, the same
    #                                 power, a key that is no ed25519 point, a removal below the
    #                                 minimum set (validator_set.MIN_VALIDATORS)
    VALIDATOR_CHANGE_PENDING = 111  # its proposer or its target already has a pending change
    VALIDATOR_CHANGE_UNKNOWN = 112  # an approval of a change id the chain does not hold
    VALIDATOR_CHANGE_EXPIRED = 113  # an approval after the change's last epoch
    # commit-reveal (abci_app/commitments.py): only the staked pools commit
    NOT_STAKED = 106  # commit by a compute node outside the staked pools (pool/<model>/<key>)
    # /credit_partials of a funded mint whose partials this validator has not posted yet
    PARTIALS_NOT_POSTED = 114
    # queries
    UNKNOWN_QUERY = 40
    BAD_QUERY = 41
    NOT_FOUND = 42
    # reserved: an unexpected exception in a handler is a bug; the server answers
    # ResponseException and CometBFT stops that node (halting is safer than diverging), so no
    # tx result carries this code today
    INTERNAL = 99


class Rejected(Exception):
    """A tx broke a state rule: raised by handlers with its `code`; nothing it wrote is kept."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
