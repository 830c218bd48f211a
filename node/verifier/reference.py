"""The verifier's own copy of the model: the registered manifest's shards, hash-checked.

reference = Reference.load(manifest_path)          # IntegrityError on a wrong shard file
reference.check_registered(manifest_hash, shard_hashes)   # what ModelRegistry says
logits = reference.logits(challenge.ids)            # [T, V], one forward pass, rounded at
                                                    # the boundaries as `wire_dtype` frames do
reference.served_logits(prompt, tokens)             # a sampled answer's, as nodes serve it
reference.vocab                                     # token text → id (unambiguous texts)
reference.stop_ids                                  # the model's end-of-sequence ids
reference.corpus_ids                                # the challenge corpus, tokenized
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.verifier.echo import vocabulary_index
from node.verifier.scoring import reference_logits, served_logits
from protocol.eip712 import as_bytes32
from protocol.errors import IntegrityError
from protocol.frames.dtypes import WIRE_DTYPE


@dataclass
class Reference:
    model_id: str  # the manifest's model_id (what the gateway calls the model)
    model_hash: str  # "sha256:<hex>", the committee's model string and the escrow's modelId
    shard_hashes: tuple[str, ...]
    head: Any
    shards: list[Any]
    vocab: dict[str, int]
    corpus_ids: list[int]
    stop_ids: frozenset[int]
    # the wire dtype of the gateway the challenges go through (its --wire-dtype): the reference
    # rounds its activations at the shard boundaries as those frames do (scoring.reference_logits)
    wire_dtype: str = WIRE_DTYPE

    @classmethod
    def load(
        cls, manifest_path: Path, corpus: str | None = None, wire_dtype: str = WIRE_DTYPE
    ) -> Reference:
        from node.model.evaluate import heldout_text
        from node.model.head import ClientHead
        from node.model.manifest import Manifest
        from node.model.shard import ShardModel

        manifest = Manifest.load(manifest_path)
        head = ClientHead.load(manifest_path, device="cpu")
        # int8: the int8 kernel whatever PLANET_INT8_KERNEL says here: what nodes serve by default
        shards = [
            ShardModel.load(manifest_path, s.shard_id, device="cpu", int8_kernel=True)
            for s in manifest.shards
        ]
        texts = [
            str(head.tokenizer.decode([token], skip_special_tokens=False))
            for token in range(int(head.vocab_size))
        ]
        return cls(
            model_id=manifest.model_id,
            model_hash=manifest.model_hash,
            shard_hashes=tuple(s.hash for s in manifest.shards),
            head=head,
            shards=shards,
            vocab=vocabulary_index(texts),
            corpus_ids=list(head.encode(corpus if corpus is not None else heldout_text())),
            stop_ids=frozenset(head.eos_token_ids),
            wire_dtype=wire_dtype,
        )

    def check_registered(self, manifest_hash: bytes, shard_hashes: Sequence[bytes]) -> None:
        """Refuse to verify with a model other than the one registered on chain."""
        own = as_bytes32(self.model_hash, "model_hash")
        if manifest_hash != own:
            raise IntegrityError(
                f"ModelRegistry has manifest {manifest_hash.hex()} for this model id, the local "
                f"manifest hashes to {own.hex()}",
                hint="verify with the registered manifest (planet model prepare, same settings)",
            )
        mine = [as_bytes32(h, "shard hash") for h in self.shard_hashes]
        if list(shard_hashes) != mine:
            raise IntegrityError(
                "ModelRegistry's shard hashes differ from the local manifest's",
                hint="verify with the registered manifest",
            )

    @torch.inference_mode()
    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        return reference_logits(self.head, self.shards, ids, self.wire_dtype)

    def served_logits(self, prompt: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """What a sampled answer is replayed on: the nodes' schedule (scoring.served_logits)."""
        return served_logits(self.head, self.shards, prompt, tokens, self.wire_dtype)
