"""torchtune's activation offloading as the step timeline runs it (``--offload-activations``; pure).

Read from torchtune v0.6.0-rc1-220-gbd2a0fc7 ``torchtune/training/_activation_offloading.py``:
``OffloadActivations`` (``use_streams=True``, ``max_fwd_stash_size=5``, ``min_offload_size=1024``) is a
``saved_tensors_hooks`` around the model's forward (``recipes/full_finetune_distributed.py``: ``with
self.activations_handling_ctx: outputs = self._model(**batch)``; the loss outside it), and
``get_act_offloading_ctx_manager`` enters a ``NoOpManager`` around ``model.output``, so the LM head's saved
input is not offloaded. Every pack takes an id; a CUDA tensor of at least 1024 bytes, not a parameter, is
copied on the side stream into a pinned ``empty_like`` and kept in ``fwd_stash`` until a later offloaded
pack's id is 5 past its own (then ``s0.wait_event`` and ``del``: its GPU storage goes where nothing else
holds it). The recipes require activation checkpointing, under which ``torch.utils.checkpoint``'s
inner hook takes every saved tensor of a layer and only the checkpoint's input (``_CheckpointFrame.
save_inputs``) reaches the offloading hook. In backward a tensor still in ``fwd_stash`` is used as it is;
the first node that unpacks an offloaded tensor clears ``fwd_stash`` in its post-hook; every other tensor is
brought back on the side stream when it is unpacked (its allocation on that stream) and kept in
``bwd_tensor_stash`` until the next such node's hook, or, where the unpacked storage gained references
(a recomputed op saved it), freed with them (``record_stream``). The last one is freed by the callback at
the end of backward."""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.peak.ledger import Ledger

MIN_OFFLOAD_BYTES = 1024
"""``min_offload_size``: smaller tensors stay on the GPU."""
FWD_STASH = 5
"""``max_fwd_stash_size``: an offloaded tensor's GPU storage is kept until a pack 5 ids later."""
OFFLOAD_STREAM = "offload"
"""``OffloadActivations.s1``, the copy stream: the tensors brought back in backward are allocated on it."""


class Pack(NamedTuple):
    """One tensor the offloading hook packs, in forward order."""

    name: str
    nbytes: int
    gpu: str | None
    """The timeline's name of its GPU storage that only the stash holds once the forward moves on (freed
    when the stash lets it go); None: something else holds it (the batch's input ids, a tensor the same
    forward saves again, the final norm's, kept in the stash to backward)."""

    @property
    def offloaded(self) -> bool:
        return self.nbytes >= MIN_OFFLOAD_BYTES


TWICE = ("x.float()", "input in fp32", "rsqrt")
"""The final RMSNorm's storages two ops save, each pack its own host copy (``norm_saves``: ``x.to(float32)``
by ``pow`` and ``mul``; ``rsqrt``'s output by ``rsqrt`` and ``mul``)."""


def final_packs(final: list[tuple[str, int]], last_hidden: tuple[str, int] | None) -> tuple[Pack, ...]:
    """The final norm's packs: its saved storages but the LM head's input (``NoOpManager``), those of
    :data:`TWICE` twice, and first the last hidden state where the norm saves it (a LayerNorm's input, an
    fp32 stream). A norm parameter's pack (an id, never offloaded) is not counted."""
    packs = [] if last_hidden is None else [Pack(*last_hidden, None)]
    for name, nbytes in final:
        if name == "LM head input":
            continue
        packs += [Pack(name, nbytes, None)] * (2 if any(w in name for w in TWICE) else 1)
    return tuple(packs)


class Stash:
    """``fwd_stash`` over one forward: which offloaded tensors still hold GPU memory, the host copies made."""

    def __init__(self, led: Ledger, held: frozenset[str] = frozenset()):
        self.led = led
        self.held = held
        """GPU storages a local of the model code holds to the end of its forward (transformers'
        ``inputs_embeds``): let go by the stash, freed when the forward returns (:meth:`release`)."""
        self.ids = 0
        self.entries: list[tuple[int, Pack]] = []
        self.host = 0
        """Pinned host bytes: every offloaded pack's copy (alive from its pack to its unpack in backward)."""
        self.let_go: set[str] = set()
        self.cleared = False

    def pack(self, pack: Pack) -> None:
        """``pack_tensor``: an id; an offloaded tensor frees the stash's entries 5 ids older first."""
        self.ids += 1
        if not pack.offloaded:
            return
        while self.entries and self.entries[0][0] <= self.ids - FWD_STASH:
            self._drop(self.entries.pop(0)[1])
        self.entries.append((self.ids, pack))
        self.host += pack.nbytes

    def _drop(self, pack: Pack) -> None:
        if pack.gpu is None:
            return
        if pack.gpu in self.held:
            self.let_go.add(pack.gpu)
        else:
            self.led.free(pack.gpu)

    def release(self, name: str) -> None:
        """The model code's local ``name`` goes out of scope: its storage is freed if the stash let it go."""
        if name in self.let_go:
            self.let_go.discard(name)
            self.led.free(name)

    def holds(self, name: str) -> bool:
        """``name`` is still in ``fwd_stash`` (unpacked as it is, nothing brought back)."""
        return any(p.gpu == name for _, p in self.entries)

    def clear(self) -> None:
        """The first backward node that unpacked an offloaded tensor ran: its hook empties ``fwd_stash``."""
        if self.cleared:
            return
        self.cleared = True
        for _, pack in self.entries:
            self._drop(pack)
        self.entries = []
