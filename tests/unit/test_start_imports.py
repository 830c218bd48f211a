"""What a process pays to start: each entry point imports only the libraries it uses (issue 41).

Every integration and e2e test starts many `planet` processes (nodes, gateways, agents, watchers,
CLI commands); a heavy import that creeps into one of their module graphs costs every start.
Each check runs a fresh interpreter (`python -c`) and reads its `sys.modules`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.model.backends import skip_unused_backends
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.fresh_imports import loaded_after

ROOT = Path(__file__).resolve().parents[2]
MODEL_STACK = ("torch", "transformers", "hqq", "torchao")
ETH_LIBRARIES = ("eth_abi", "eth_utils", "pydantic", "web3", "eth_account")


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        # the `planet` command line: every command's parser, no command's runtime
        (
            "planet.main",
            (*MODEL_STACK, "numpy", "aiohttp", "web3", "eth_account", "eth_abi", "cryptography"),
        ),
        # processes that never run a model layer
        ("node.gateway.run", (*MODEL_STACK, "web3", "eth_account")),
        ("node.gateway.personal", (*MODEL_STACK, "web3", "eth_account")),
        ("node.agent.__main__", MODEL_STACK),
        ("node.watcher.__main__", MODEL_STACK),
        # the node's server loads torch only when it loads its shard
        ("node.server.run", (*MODEL_STACK, "web3", "eth_account")),
        # a node opening its node key needs nacl, not eth-account
        ("node.keys", ("eth_account", "eth_utils", "web3")),
        # the shared vocabulary hashes with protocol.abi_words: eth-abi and eth-utils (with
        # pydantic) were ~0.2 CPU-s of every node's, relay's and committee app's start
        ("protocol.eip712", ETH_LIBRARIES),
        ("shares.merkle", ETH_LIBRARIES),
        ("node.server.run", ETH_LIBRARIES),
        ("node.relay.run", ETH_LIBRARIES),
        ("abci_app.app", ETH_LIBRARIES),
        # `planet devnet fund / status / exec` read the devnet's state and call anvil's RPC:
        # deploy.evm (web3 + eth-account, ~1.4 CPU-s) was imported for its ETHER constant
        ("deploy.devnet.fund", ("web3", "eth_account")),
        ("deploy.devnet.plan", ("web3", "eth_account")),
        ("deploy.devnet.status", ("web3", "eth_account", "numpy")),
        # the launcher (`planet local`, the node agent, `devnet status`) starts node processes:
        # the node/server package re-exported the server's app (aiohttp.web, numpy) to it
        ("node.server.launcher", ("node.server.app", "aiohttp.web", "numpy")),
        ("node.agent.__main__", ("node.server.app", "numpy", "web3")),
        # the served-work hashes take numpy only when they hash rows
        ("protocol.served", ("numpy",)),
    ],
)
def test_entry_point_imports_stay_light(module: str, forbidden: tuple[str, ...]) -> None:
    assert loaded_after(f"import {module}", *forbidden) == []


OTHER_COMMAND_GROUPS = (
    "deploy.cli.devnet",
    "deploy.cli.committee",
    "deploy.cli.contracts",
    "node.cli.earnings",
    "node.cli.gateway",
    "node.cli.ask",
    "node.cli.credits",
)


@pytest.mark.parametrize(
    ("argv", "own"),
    [
        (["-v", "node", "serve"], "node.cli.node"),
        (["relay", "serve"], "node.cli.relay"),
        (["stake", "--role", "compute"], "node.cli.operator"),
    ],
)
def test_a_planet_command_imports_only_its_own_command_group(argv: list[str], own: str) -> None:
    """`planet -v node serve` (every node start) builds the parser of its group alone: the other
    groups (the devnet's, the gateway's, earnings...) were ~0.1 CPU-s of each `planet` start."""
    code = f"from planet.main import build_parser, command_of\nbuild_parser(command_of({argv!r}))"
    others = tuple(name for name in OTHER_COMMAND_GROUPS if name != own)
    assert loaded_after(code, own, *others) == [own]


def test_client_head_loads_without_the_modelling_stack(tmp_path: Path) -> None:
    """A gateway's or `planet ask`'s head: torch and `tokenizers`, not transformers at all
    (its import was ~1.1 CPU-s of every gateway, verifier and `planet ask`), nor its model
    classes (nor, through them, hqq and torchao)."""
    from node.model.prepare import prepare

    make_tiny_model(tmp_path / "src", layers=2, hidden=32)
    manifest = prepare(tmp_path / "src", parts=1, out=tmp_path / "m", progress=lambda _: None)
    heavy = ("transformers", "transformers.modeling_utils", "hqq", "torchao")
    code = f"from node.model.head import ClientHead\nClientHead.load({str(manifest)!r}, 'cpu')"
    assert loaded_after(code, *heavy) == []


def test_an_fp32_node_loads_its_layers_without_hqq_or_torchao() -> None:
    """The real effect, in a fresh interpreter: `skip_unused_backends` before transformers, and
    the decoder layers load without the quant libraries an fp32 shard does not use."""
    code = (
        "from node.model.backends import skip_unused_backends\n"
        "assert skip_unused_backends({'none'}) == ('hqq', 'torchao')\n"
        "import transformers.models.llama.modeling_llama"
    )
    assert loaded_after(code, "hqq", "torchao") == []


@pytest.mark.parametrize(
    ("quant", "skipped"), [("none", ("hqq", "torchao")), ("int8", ("hqq",)), ("int4", ("torchao",))]
)
def test_each_quant_skips_only_the_other_quants_libraries(
    monkeypatch: pytest.MonkeyPatch, quant: str, skipped: tuple[str, ...]
) -> None:
    # a stand-in module table: the decision is read off it, this process's imports stay as they are
    table = {
        name: module
        for name, module in sys.modules.items()
        if name.split(".")[0] not in ("transformers", "hqq", "torchao")
    }
    monkeypatch.setattr(sys, "modules", table)
    assert skip_unused_backends({quant}) == skipped
    assert [name for name in ("hqq", "torchao") if name in table] == list(skipped)
    assert all(table[name] is None for name in skipped)


def test_skipping_changes_nothing_once_transformers_or_the_library_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = object()
    monkeypatch.setattr(sys, "modules", {"transformers": loaded})
    assert skip_unused_backends({"none"}) == ()
    assert sys.modules == {"transformers": loaded}
    monkeypatch.setattr(sys, "modules", {"hqq": loaded})
    assert skip_unused_backends({"none"}) == ("torchao",)
    assert sys.modules == {"hqq": loaded, "torchao": None}


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_a_node_loads_and_runs_its_shard_without_transformers_or_torchao(
    tmp_path: Path, quant: str
) -> None:
    """A node on the default (fast) path: its config read as JSON (ShardConfig), an int8 file
    de-quantized by node.model.int8_file. transformers' AutoConfig alone imports
    torch._dynamo (~2.3 s of CPU a start), torchao ~1.9 s more."""
    from node.model.prepare import prepare

    make_tiny_model(tmp_path / "src", layers=2, hidden=32)
    manifest = prepare(
        tmp_path / "src", parts=1, quant=quant, out=tmp_path / "m", progress=lambda _: None
    )
    code = (
        "import torch\n"
        "from node.model.shard import ShardModel\n"
        f"shard = ShardModel.load({str(manifest)!r}, 0, device='cpu')\n"
        "assert shard.path == 'fast' and shard.quant == " + repr(quant) + "\n"
        "shard.forward(torch.ones(1, 3, shard.hidden_size), torch.arange(3), shard.new_cache())"
    )
    assert loaded_after(code, "transformers", "torchao", "hqq", "torch._dynamo") == []


def test_reusing_a_prepared_model_does_not_import_transformers(tmp_path: Path) -> None:
    """`prepare` on an output already there (every bench's and `planet local`'s path): the layer
    count comes from config.json as JSON, the hashes are re-derived, transformers' AutoConfig
    (torch._dynamo with it, ~2.3 CPU-s) stays out."""
    from node.model.prepare import prepare

    make_tiny_model(tmp_path / "src", layers=2, hidden=32)
    manifest = prepare(tmp_path / "src", parts=2, out=tmp_path / "m", progress=lambda _: None)
    code = (
        "from node.model.prepare import prepare\n"
        f"path = prepare({str(tmp_path / 'src')!r}, parts=2, out={str(tmp_path / 'm')!r},"
        " progress=print)\n"
        f"assert str(path) == {str(manifest)!r}, path"
    )
    assert loaded_after(code, "transformers", "torch._dynamo") == []


def test_a_bench_machine_block_does_not_import_torch() -> None:
    """bench/_common.machine() of a bench that never imported torch (most of the small benches'
    smoke runs): torch's version read from its files, not by importing it (~1.7 CPU-s), and the
    same string `torch.__version__` gives."""
    import torch

    code = "import json\nfrom bench._common import machine\nprint(json.dumps(machine()))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = f"{code}\nimport sys\nprint(json.dumps('torch' in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    block, loaded = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert loaded is False
    assert block["torch"] == torch.__version__
    assert block["device"] == "cpu"
