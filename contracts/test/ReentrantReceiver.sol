// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title Test-only: a hostile payee. It acts on the target contracts through `act`, and when paid it
/// tries to re-enter with a preset call (recording the outcome) or refuses the payment.
contract ReentrantReceiver {
    address public reentryTarget;
    bytes public reentryData;
    bool public rejectPayments;
    uint256 public reentryAttempts;
    uint256 public reentrySuccesses;
    bytes public lastReentryError;

    function act(address target, uint256 value, bytes calldata data) external payable returns (bytes memory) {
        (bool ok, bytes memory ret) = target.call{value: value}(data);
        if (!ok) {
            assembly {
                revert(add(ret, 0x20), mload(ret))
            }
        }
        return ret;
    }

    function arm(address target, bytes calldata data) external {
        reentryTarget = target;
        reentryData = data;
    }

    function setRejectPayments(bool reject) external {
        rejectPayments = reject;
    }

    receive() external payable {
        if (rejectPayments) revert("payment rejected");
        if (reentryTarget != address(0)) {
            address target = reentryTarget;
            reentryTarget = address(0);
            ++reentryAttempts;
            (bool ok, bytes memory ret) = target.call(reentryData);
            if (ok) ++reentrySuccesses;
            else lastReentryError = ret;
        }
    }
}
