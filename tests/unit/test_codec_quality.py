"""node.model.evaluate.codec_quality: teacher-forced agreement and perplexity ratio of a wire
codec against the uncompressed circuit of shards (tiny random model, in-process)."""

from __future__ import annotations

import numpy as np
import pytest

from node.model.evaluate import codec_quality, heldout_split, heldout_text
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel
from tests.doubles.tiny_model import make_tiny_model, tiny_words

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[ClientHead, list[ShardModel], str]:
    root = tmp_path_factory.mktemp("codec-quality")
    make_tiny_model(root / "src", layers=4, hidden=128, init_std=0.05)
    path = prepare(model=root / "src", parts=2, out=root / "out", progress=lambda _m: None)
    head = ClientHead.load(path, device="cpu")
    shards = [ShardModel.load(path, k, device="cpu") for k in range(2)]
    words = tiny_words()
    text = " ".join(words[(7 * i) % len(words)] for i in range(120))
    return head, shards, text


def test_codec_quality_identity_is_perfect_and_noise_is_not(chain):
    head, shards, text = chain
    rng = np.random.default_rng(0)

    def noisy(a: np.ndarray) -> np.ndarray:
        return a + rng.standard_normal(a.shape).astype(np.float32) * 3 * a.std()

    m = codec_quality(head, shards, text, {"same": lambda a: a, "noisy": noisy})
    assert m["positions"] == 119
    assert m["top1_agreement_same"] == 1.0 and m["flips_same"] == 0
    assert m["ratio_ppl_same_vs_raw"] == pytest.approx(1.0, abs=1e-5)
    assert m["top1_agreement_noisy"] < 0.9 and m["flips_noisy"] > 12
    assert m["ratio_ppl_noisy_vs_raw"] != pytest.approx(1.0, abs=1e-3)
    assert m["gap_error_rms_same"] == 0.0 and m["kl_same"] == pytest.approx(0.0, abs=1e-9)
    assert m["gap_error_rms_noisy"] > 0.01 and m["kl_noisy"] > 1e-3


def test_heldout_split_cuts_at_a_paragraph_into_two_halves():
    tune, test = heldout_split()
    whole = heldout_text()
    assert tune and test and tune.split("\n\n")[-1] != test.split("\n\n")[0]
    assert tune.split() + test.split() == whole.split()
    assert abs(len(tune.split()) - len(test.split())) < 0.2 * len(whole.split())


def test_codec_quality_takes_registered_wire_codec_names(chain):
    head, shards, text = chain
    m = codec_quality(head, shards, text, ["ohq7", "hq9", "rq"])
    for codec in ("ohq7", "hq9", "rq"):
        assert 0.9 <= m[f"top1_agreement_{codec}"] <= 1.0
        assert m[f"ratio_ppl_{codec}_vs_raw"] == pytest.approx(1.0, abs=0.02)
