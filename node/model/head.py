"""The client's end of the model: tokenizer, token embeddings, final norm and LM head.

These stay with the client (as in Petals), so compute nodes only ever see hidden states.
`ClientHead` is the one head class: torch tensors for model code (evaluation, verifiers), numpy
arrays (`embed_np`, `logits_np`, `logits_batch_np`) for circuits and the gateway, which see it
through the `node.client.types.Head` protocol. `client.safetensors` holds
`model.embed_tokens.weight`, `model.norm.weight` and, when the model does not tie them to the
embeddings, `lm_head.weight`.

The head reads `config.json` itself (`HeadConfig`) and applies the final RMSNorm itself, so
loading it never imports transformers' modelling stack (~2 s of CPU a process: gateways,
`planet ask`; node/model/head_config.py says why), and its tokenizer is `tokenizers` with the
model's chat template (node/model/tokenizer.py), so not transformers at all where the prepared
tokenizer is a `tokenizer.json` (another ~1.1 s).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from node.model.device import resolve_device
from node.model.head_config import HeadConfig
from node.model.manifest import (
    CLIENT_FILE,
    TOKENIZER_DIR,
    Manifest,
    manifest_path,
    verify_file,
)
from node.model.tokenizer import ChatTokenizer
from protocol.errors import ConfigError, UsageError

EMBED_KEY = "model.embed_tokens.weight"
NORM_KEY = "model.norm.weight"
LM_HEAD_KEY = "lm_head.weight"


def client_tensors(state: Mapping[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """The client's tensors out of a full model's state dict (fp32, contiguous, CPU)."""
    keys = [EMBED_KEY, NORM_KEY] + ([] if tied else [LM_HEAD_KEY])
    missing = [key for key in keys if key not in state]
    if missing:
        raise ConfigError(f"model weights lack {', '.join(missing)}")
    return {key: state[key].detach().to("cpu", torch.float32).contiguous() for key in keys}


# The head's matmul of 2 or 3 rows is slower on CPU than of 4 (torch's fp32 kernels, SmolLM2's
# 49,152 × 576 head, one thread, 2026-12-05: 1 row 10 ms, 2 rows 27, 3 rows 41, 4 rows 18, 9
# rows 23, 17 rows 31): a batch of 2 or 3 rows (a short speculative draft, sessions batched) is
# padded to 4 rows of zeros, whose logits are dropped.
PADDED_ROWS = 4


class ClientHead:
    """Tokenizer + embeddings + final norm + LM head of a prepared model."""

    def __init__(
        self,
        config: HeadConfig,
        tokenizer: Any,
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.device = device
        self.hidden_size: int = config.hidden_size
        embed = tensors[EMBED_KEY].to(device, torch.float32)
        self._embed = embed  # [V, H]
        self._norm_weight = tensors[NORM_KEY].to(device, torch.float32)
        self._norm_eps = config.rms_norm_eps
        head = tensors.get(LM_HEAD_KEY)
        self._lm_head = embed if head is None else head.to(device, torch.float32)  # [V, H]
        self.vocab_size: int = int(self._lm_head.shape[0])
        self.eos_token_ids: frozenset[int] = _eos_ids(config, tokenizer)
        # positions the model was trained for (prompt + answer)
        self.context_length: int = config.max_position_embeddings

    @classmethod
    def load(
        cls, manifest: str | Path, device: str | torch.device = "auto", *, verify: bool = True
    ) -> ClientHead:
        from safetensors.torch import load_file

        path = manifest_path(manifest)
        parsed = Manifest.load(path)
        directory = path.parent
        client_file = directory / CLIENT_FILE
        if verify:
            verify_file(client_file, parsed.client_hash)
        config = HeadConfig.load(directory)
        tokenizer: Any = ChatTokenizer.load(directory / TOKENIZER_DIR)
        if tokenizer is None:  # not a tokenizer.json with one chat template: transformers reads it
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(directory / TOKENIZER_DIR))
        tensors = load_file(str(client_file), device="cpu")
        return cls(config, tokenizer, tensors, resolve_device(device))

    # ---- text <-> ids --------------------------------------------------------------------
    def chat_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of a chat (list of {role, content}) with the generation prompt appended."""
        if not messages:
            raise UsageError("a chat needs at least one message")
        ids = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return [int(i) for i in ids]

    def encode(self, text: str) -> list[int]:
        """Plain token ids of `text` (no chat template, no special tokens added)."""
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def token_text(self, token: int) -> str:
        """One token's own text, special tokens included (logprobs show it)."""
        return str(self.tokenizer.decode([int(token)], skip_special_tokens=False))

    # ---- tensors -------------------------------------------------------------------------
    @torch.inference_mode()
    def embed(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """[1, T, H] float32 (on CPU) for token ids [T]."""
        index = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(-1)
        if index.numel() == 0:
            raise UsageError("no tokens to embed")
        if int(index.min()) < 0 or int(index.max()) >= self._embed.shape[0]:
            raise UsageError(f"token id outside the vocabulary [0, {self._embed.shape[0]})")
        return self._embed[index].unsqueeze(0).to("cpu")

    @torch.inference_mode()
    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """[V] float32 logits for the last position of `hidden_last` ([H], [1, H] or
        [1, T, H])."""
        last = hidden_last.reshape(-1, self.hidden_size)[-1]
        return self.all_logits(last.reshape(1, 1, -1))[0]

    @torch.inference_mode()
    def all_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, V] float32 logits for every position of `hidden` [1, T, H] (CPU)."""
        states = hidden.to(self.device, torch.float32).reshape(1, -1, self.hidden_size)
        # F.linear, as the model's nn.Linear head does, so argmax ties break the same way.
        return nn.functional.linear(self._final_norm(states), self._lm_head)[0].to("cpu")

    def _final_norm(self, states: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm of every family in node.model.family (Llama, Qwen2): transformers'
        `LlamaRMSNorm.forward` / `Qwen2RMSNorm.forward` op for op on float32, so the logits are
        bit-identical (tests/unit/test_head_config.py checks it against both classes). A family
        with another final norm needs its own here."""
        variance = states.pow(2).mean(-1, keepdim=True)
        return self._norm_weight * (states * torch.rsqrt(variance + self._norm_eps))

    # ---- numpy, for circuits and the gateway -----------------------------------------------
    def embed_np(self, ids: Sequence[int]) -> np.ndarray:
        """[1, T, H] float32 for token ids [T]."""
        with torch.inference_mode():
            return self.embed(list(ids)).float().cpu().numpy()

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray:
        """[V] float32 logits of one position's hidden state [H]."""
        with torch.inference_mode():
            hidden = torch.from_numpy(np.ascontiguousarray(hidden_last, dtype=np.float32))
            return self.logits(hidden).float().cpu().numpy().reshape(-1)

    def logits_batch_np(self, hidden_last: np.ndarray) -> np.ndarray:
        """[B, V] float32 logits of B sessions' last rows [B, H] (one matmul for all)."""
        with torch.inference_mode():
            rows = torch.from_numpy(np.ascontiguousarray(hidden_last, dtype=np.float32))
            rows = rows.reshape(-1, rows.shape[-1])
            count = rows.shape[0]
            if 1 < count < PADDED_ROWS:  # 2 or 3 rows: padded (see PADDED_ROWS)
                rows = torch.cat([rows, rows.new_zeros(PADDED_ROWS - count, rows.shape[-1])])
            return self.all_logits(rows.reshape(1, -1, rows.shape[-1]))[:count].float().numpy()


def _eos_ids(config: HeadConfig, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set(config.eos_token_id)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
