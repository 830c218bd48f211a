"""Manifest: canonical hashes anyone can re-derive, validation, tamper detection, prepare reuse."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from node.model.head import ClientHead
from node.model.manifest import (
    Manifest,
    ShardIntegrityError,
    config_hash,
    hashable_json,
    tokenizer_hash,
    verify_directory,
)
from node.model.prepare import parse_split, prepare, split_layers
from node.model.shard import ShardModel
from protocol.canonical import canonical_json
from protocol.errors import ConfigError, IntegrityError, UsageError
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    make_tiny_model(root / "src", layers=4, hidden=64, tied=True)
    return prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_manifest_hashes_rederivable_from_raw_files(prepared: Path) -> None:
    directory = prepared.parent
    raw = json.loads(prepared.read_text())
    # model_hash: sha256 of the canonical JSON of the manifest without model_hash
    body = {k: v for k, v in raw.items() if k != "model_hash"}
    assert raw["model_hash"] == _sha(canonical_json(body))
    # shard and client hashes: sha256 of the files' bytes
    for shard in raw["shards"]:
        data = (directory / shard["file"]).read_bytes()
        assert shard["hash"] == _sha(data)
        assert shard["size"] == len(data)
    assert raw["client_hash"] == _sha((directory / "client.safetensors").read_bytes())
    # config hash: canonical JSON of the parsed file, floats written as repr strings
    config = json.loads((directory / "config.json").read_text())
    assert raw["config_hash"] == _sha(canonical_json(hashable_json(config)))
    assert raw["shards"][0]["layers"] == [0, 2] and raw["shards"][1]["layers"] == [2, 4]


def test_manifest_config_hash_ignores_formatting(tmp_path: Path, prepared: Path) -> None:
    original = json.loads((prepared.parent / "config.json").read_text())
    reformatted = tmp_path / "config.json"
    reformatted.write_text(json.dumps(dict(reversed(list(original.items()))), indent=7))
    assert config_hash(reformatted) == config_hash(prepared.parent / "config.json")
    original["rms_norm_eps"] = 2e-6
    reformatted.write_text(json.dumps(original))
    assert config_hash(reformatted) != config_hash(prepared.parent / "config.json")


def test_manifest_tokenizer_hash_changes_with_chat_template(tmp_path: Path, prepared: Path) -> None:
    copy = tmp_path / "tok"
    copy.mkdir()
    for path in (prepared.parent / "tokenizer").iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    assert tokenizer_hash(copy) == Manifest.load(prepared).tokenizer_hash
    config_file = copy / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = "{{ messages }}"
    config_file.write_text(json.dumps(config))
    assert tokenizer_hash(copy) != Manifest.load(prepared).tokenizer_hash


def test_manifest_save_load_round_trip_equal(tmp_path: Path, prepared: Path) -> None:
    manifest = Manifest.load(prepared)
    again = Manifest.load(manifest.save(tmp_path / "m.json"))
    assert again == manifest
    assert manifest.total_layers == 4 and len(manifest.shards) == 2
    assert {s.quant for s in manifest.shards} == {"none"}


def test_manifest_tampered_shard_raises_integrity_error_naming_both_hashes(
    tmp_path: Path, prepared: Path
) -> None:
    directory = tmp_path / "copy"
    directory.mkdir()
    for path in prepared.parent.rglob("*"):
        target = directory / path.relative_to(prepared.parent)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.write_bytes(path.read_bytes())
    shard_file = directory / "shard-1.safetensors"
    data = bytearray(shard_file.read_bytes())
    data[-1] ^= 0x01  # flip one bit of the last weight
    shard_file.write_bytes(bytes(data))
    expected = Manifest.load(directory).shards[1].hash
    actual = _sha(bytes(data))
    with pytest.raises(ShardIntegrityError) as caught:
        ShardModel.load(directory / "manifest.json", 1)
    assert expected in str(caught.value) and actual in str(caught.value)
    assert caught.value.expected == expected and caught.value.actual == actual
    with pytest.raises(IntegrityError):
        verify_directory(Manifest.load(directory), directory)
    ShardModel.load(directory / "manifest.json", 0)  # the untouched shard still loads


def test_manifest_tampered_client_file_raises_integrity_error(
    tmp_path: Path, prepared: Path
) -> None:
    raw = json.loads(prepared.read_text())
    (tmp_path / "client.safetensors").write_bytes(b"not the client file")
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(IntegrityError, match=raw["client_hash"]):
        ClientHead.load(tmp_path / "manifest.json")


def test_manifest_edited_field_raises_integrity_error(tmp_path: Path, prepared: Path) -> None:
    raw = json.loads(prepared.read_text())
    raw["shards"][0]["quant"] = "int8"
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(IntegrityError, match="model_hash"):
        Manifest.load(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.pop("total_layers"), "missing field"),
        (lambda m: m.update(extra=1), "unknown field"),
        (lambda m: m["shards"][1].update(layers=[3, 4]), "do not continue"),
        (lambda m: m["shards"][1].update(layers=[2, 3]), "cover layers"),
        (lambda m: m.update(config_hash="sha256:xyz"), "hash"),
        (lambda m: m["shards"][0].update(file="../escape.safetensors"), "plain file name"),
        (lambda m: m["shards"][0].update(file="shard-0.safetensors\n"), "plain file name"),
        (lambda m: m.update(config_hash=m["config_hash"] + "\n"), "hash"),
        (lambda m: m["shards"][0].update(quant="int3"), "unknown quant"),
    ],
)
def test_manifest_malformed_raises_config_error(
    tmp_path: Path, prepared: Path, edit, message
) -> None:
    raw = json.loads(prepared.read_text())
    edit(raw)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message):
        Manifest.load(path)


def test_manifest_missing_file_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no manifest"):
        Manifest.load(tmp_path / "nothing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Manifest.load(tmp_path / "bad.json")


def test_split_layers_even_uneven_and_errors() -> None:
    assert split_layers(30, 3) == [(0, 10), (10, 20), (20, 30)]
    assert split_layers(30, 4) == [(0, 8), (8, 16), (16, 23), (23, 30)]
    assert split_layers(30, 3, [10, 12, 8]) == [(0, 10), (10, 22), (22, 30)]
    assert split_layers(6, 6) == [(i, i + 1) for i in range(6)]
    with pytest.raises(UsageError, match="sums to 29"):
        split_layers(30, 3, [10, 11, 8])
    with pytest.raises(UsageError, match="more than"):
        split_layers(30, 31)
    with pytest.raises(UsageError, match="positive"):
        split_layers(30, 3, [30, 0, 0])
    with pytest.raises(UsageError, match="3 sizes"):
        split_layers(30, 2, [10, 10, 10])
    assert parse_split("10,12,8") == [10, 12, 8]
    with pytest.raises(UsageError):
        parse_split("10,a")


def test_prepare_existing_valid_output_is_reused(prepared: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in prepared.parent.iterdir()}
    source = prepared.parent.parent / "src"
    again = prepare(source, parts=2, out=prepared.parent, progress=lambda _: None)
    assert again == prepared
    assert {p.name: p.stat().st_mtime_ns for p in prepared.parent.iterdir()} == before


def test_prepare_bad_inputs_raise_usage_errors(tmp_path: Path, prepared: Path) -> None:
    source = prepared.parent.parent / "src"
    with pytest.raises(UsageError, match="does not exist"):
        prepare(tmp_path / "missing", parts=2, progress=lambda _: None)
    with pytest.raises(UsageError, match="more than"):
        prepare(source, parts=5, out=tmp_path / "o", progress=lambda _: None)
    with pytest.raises(UsageError, match="sums to"):
        prepare(source, parts=2, split=[1, 2], out=tmp_path / "o", progress=lambda _: None)
    with pytest.raises(ConfigError, match="unknown quant"):
        prepare(source, parts=2, quant="int3", out=tmp_path / "o", progress=lambda _: None)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_prepare_same_inputs_give_same_model_hash(tmp_path: Path, prepared: Path, quant) -> None:
    source = prepared.parent.parent / "src"
    first = prepare(source, parts=2, quant=quant, out=tmp_path / "a", progress=lambda _: None)
    second = prepare(source, parts=2, quant=quant, out=tmp_path / "b", progress=lambda _: None)
    assert Manifest.load(first).model_hash == Manifest.load(second).model_hash
    assert Manifest.load(first).model_hash != Manifest.load(prepared).model_hash


def test_prepare_refuses_too_many_parts_before_converting_the_default_model(
    tmp_path: Path, monkeypatch
) -> None:
    """A first `planet model prepare --parts 99` used to convert the GGUF (about a minute) and
    only then say the model has 30 layers; the GGUF's own layer count refuses it at once."""
    from node.model import source

    monkeypatch.setenv("PLANET_HOME", str(tmp_path))  # nothing converted yet

    def no_conversion(*_args: object) -> None:
        raise AssertionError("converted before the parts were checked")

    monkeypatch.setattr(source, "convert_gguf", no_conversion)
    assert source.default_layer_count() == 30  # SmolLM2-135M, from the GGUF's metadata
    with pytest.raises(UsageError, match="more than the model's 30 layers"):
        prepare(parts=99)
    with pytest.raises(UsageError, match="--split sums to 29"):
        prepare(parts=2, split=[15, 14])
