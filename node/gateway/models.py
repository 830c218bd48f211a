"""The models one gateway answers (issue 44): what each is called, and which one a question names.

A gateway serves one or more registered models (`planet gateway serve --manifest M1 --manifest
M2`): each is a `ModelRoute` (its name, hashes and shard count, its client head, its router
over the committee's nodes of that model; its circuit pool is the gateway's, app.py). A question
names its model in OpenAI's `model` field; `ModelTable.route` finds it or refuses it by name
(404 `model_not_found`, listing what is served).

Names (`served_names`): a model answers to its `name`, its model hash (`sha256:…`) and the
name of its manifest's folder (the shard set's name, as `planet join --model` takes it:
`smollm2-135m-1p-int8`). `name` is the manifest's `model_id` (`smollm2-135m`) unless a model
listed before it already has that name (two shard sets of one base model: another quantization
or shard count is another model hash), then its folder's name. The first model keeps the
manifest's own name, so clients that asked a one-model gateway ask the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.gateway.errors import NotFound
from protocol.errors import UsageError


@dataclass
class ModelInfo:
    name: str  # what clients put in "model" (see `served_names`)
    model_hash: str  # "sha256:<hex>", the committee's model string
    model_id: bytes  # 32 bytes, the escrow's modelId
    shards: int
    aliases: tuple[str, ...] = ()  # other names a question may give it (hash, folder name)


@dataclass
class ModelRoute:
    """One served model: its names, its client head and its router (app.py adds the circuits)."""

    info: ModelInfo
    head: Any  # node.client.types.Head (node.model.head.ClientHead)
    router: Any  # node.gateway.router.Router over this model's nodes
    circuits: Any = field(default=None)  # node.gateway.circuits.CircuitPool, set by the Gateway


def routes_after_first(
    infos: Sequence[ModelInfo], heads: Sequence[Any], routers: Sequence[Any]
) -> list[ModelRoute]:
    """The `Gateway`'s `more_models`: every served model but the first (its own fields), each
    with its head and router, in the order given."""
    return [
        ModelRoute(info, head, router)
        for info, head, router in zip(infos[1:], heads[1:], routers[1:], strict=True)
    ]


@dataclass(frozen=True, slots=True)
class ServedName:
    name: str
    aliases: tuple[str, ...]


def served_names(models: Sequence[tuple[str, str, Path | None]]) -> list[ServedName]:
    """For each (manifest model_id, model hash, manifest path) in order: its name and aliases.
    A model hash given twice is the same model served twice: refused (`UsageError`)."""
    seen_hashes: set[str] = set()
    taken: set[str] = set()
    out = []
    for model_id, model_hash, manifest in models:
        if model_hash in seen_hashes:
            raise UsageError(
                f"the model {model_hash[:19]}… is given twice",
                hint="give each --manifest once: one per model",
            )
        seen_hashes.add(model_hash)
        folder = manifest.resolve().parent.name if manifest is not None else ""
        name = model_id if model_id not in taken else folder or model_hash
        if name in taken:
            raise UsageError(
                f"two models would both be called {name!r}",
                hint="keep each model's manifest in a folder of its own name",
            )
        aliases = tuple(a for a in dict.fromkeys((model_hash, folder)) if a and a != name)
        taken.add(name)
        out.append(ServedName(name, aliases))
    return out


class ModelTable:
    """The served models in order (the first: a question's default in the gateway's own
    pages), found by any of their names."""

    def __init__(self, routes: Sequence[ModelRoute]) -> None:
        if not routes:
            raise ValueError("a gateway serves at least one model")
        self.routes = list(routes)
        self._by_name: dict[str, ModelRoute] = {}
        for route in self.routes:  # names first: an alias never shadows another's name
            self._by_name.setdefault(route.info.name, route)
        for route in self.routes:  # its model hash always names it
            for alias in (route.info.model_hash, *route.info.aliases):
                self._by_name.setdefault(alias, route)

    @property
    def first(self) -> ModelRoute:
        return self.routes[0]

    def names(self) -> list[str]:
        return [route.info.name for route in self.routes]

    def route(self, name: str) -> ModelRoute:
        """The model a question names, or 404 `model_not_found` naming what is served."""
        found = self._by_name.get(name)
        if found is None:
            served = ", ".join(repr(n) for n in self.names())
            raise NotFound(
                "model_not_found",
                f"the model {name[:80]!r} is not served here; this gateway serves {served}",
                param="model",
            )
        return found
