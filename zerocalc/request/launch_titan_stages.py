"""torchtitan's split of a model's layers into pipeline stages, read from a job TOML (pure): the layers of
each stage once the model's layer count is known, and the options (``vpp``, the end stages' layers or each
stage's) that give zerocalc the same split."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from zerocalc.base.errors import InputError


@dataclass(frozen=True)
class TitanStages:
    """torchtitan's split of a model's L layers into S pipeline stages, s = S/p of them on each of the p
    ranks (rank i holds stages i, i + p, …: ``stage_ids_this_rank`` / ``pipeline_module_split`` ``loop``
    style), the embedding on stage 0 and the norm and head on stage S − 1.

    * Explicit: ``pipeline_parallel_split_points`` (``layers.N`` starts a stage; 9dec370, v0.1.0) or
      ``module_fqns_per_model_part`` (each stage's modules; v0.2.2).
    * v0.2.2's default (``distributed/pipeline_parallel.py`` ``pipeline_llm`` and
      ``generate_llm_fqn_per_model_part``; v0.1.0's ``generate_split_points`` splits alike): s = 1 for a
      single-stage schedule, 2 for a multi-stage one, or S = ⌈(L + a + z)/``layers_per_stage``⌉; the
      embedding counts as a = ``first_stage_less_layers`` layers and the head as z =
      ``last_stage_less_layers`` (1 each), the L + a + z split evenly over S, the first (L + a + z) mod S
      stages one more; Llama 3.1 405B at p 8: 15, 16 × 6, 15.
    * 9dec370's default (``parallelisms/pipelining_utils.py`` ``generate_split_points``): ⌊L/S⌋ on the
      first stage, one more on each following stage while L mod S lasts, the rest on the last.
    """

    where: str
    pp: int
    multi_stage: bool
    counted: bool
    """The older layouts' split (9dec370's), else v0.2.2's."""
    schedule_key: str
    first_weight: int = 1
    last_weight: int = 1
    layers_per_stage: int | None = None
    split_points: tuple[str, ...] | None = None
    parts: tuple[int, ...] | None = None
    """Layers of each stage of ``module_fqns_per_model_part``."""

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """The layers of each of the S stages, in order."""
        if self.parts is not None:
            if sum(self.parts) != num_layers:
                raise self._problem(f"its stages hold {sum(self.parts)} layers, the model {num_layers}")
            return self.parts
        if self.split_points is not None:
            return self._from_points(num_layers)
        stages = self.pp * (2 if self.multi_stage else 1)
        if self.counted:
            if stages > num_layers:
                raise self._problem(f"{stages} stages are more than the model's {num_layers} layers")
            base, extra = divmod(num_layers, stages)
            counts = [base]
            for _ in range(stages - 2):
                counts.append(base + (1 if extra > 0 else 0))
                extra -= 1
            return (*counts, num_layers - sum(counts))
        effective = num_layers + self.first_weight + self.last_weight
        if self.layers_per_stage is not None:
            stages = -(-effective // self.layers_per_stage)
        per, extra = divmod(effective, stages)
        if per < max(self.first_weight, self.last_weight, 1):
            raise self._problem(f"{stages} stages over {effective} effective layers leave {per} a stage")
        counts = [per + (1 if stage < extra else 0) for stage in range(stages)]
        counts[0] -= self.first_weight
        counts[-1] -= self.last_weight
        return tuple(counts)

    def _from_points(self, num_layers: int) -> tuple[int, ...]:
        starts: list[int] = []
        for point in self.split_points or ():
            name, _, index = str(point).partition(".")
            if name != "layers" or not index.isdigit():
                raise self._problem(f"split point {point!r} is not a layer ('layers.N')")
            starts.append(int(index))
        bounds = [0, *starts, num_layers]
        if any(b <= a for a, b in pairwise(bounds)):
            raise self._problem(
                f"split points {', '.join(self.split_points or ())} are not increasing layers"
            )
        return tuple(b - a for a, b in pairwise(bounds))

    def _problem(self, why: str) -> InputError:
        return InputError(f"{self.where}: torchtitan's pipeline stages cannot be built ({why})")

    def options(self, num_layers: int) -> dict[str, str]:
        """``vpp`` and the split for the model's L layers: the first and last stage's layers where the
        stages are Megatron-LM's uneven split (s equal chunks a rank, every rank but the first and last
        holding the same layers: :func:`~zerocalc.parallel.pipeline.stage_layer_counts`), else each
        stage's layers (``--pp-stage-layers``: torchtitan's stage k is on rank k mod p, as zerocalc's
        virtual stage k); an :class:`InputError` where a stage holds no layer (the embedding or the head
        alone), which zerocalc does not model."""
        from zerocalc.parallel.mesh import describe_layer_counts
        from zerocalc.parallel.pipeline import split_problem, stage_layer_counts

        counts = self.stage_layers(num_layers)
        stages, pp = len(counts), self.pp
        if stages % pp:
            raise self._problem(f"{stages} stages do not divide over {pp} pipeline ranks")
        vpp = stages // pp
        if (vpp > 1) != self.multi_stage:
            kind = "several stages a rank" if self.multi_stage else "one stage a rank"
            raise self._problem(f"{self.schedule_key} runs {kind}, the split gives {vpp}")
        ranks = [vpp * counts[rank] for rank in range(pp)]
        chunked = all(counts[j * pp + rank] == counts[rank] for j in range(vpp) for rank in range(pp))
        middle = set(ranks[1:-1])
        first = last = None
        if len(middle) == 1:
            (even,) = middle
            first = ranks[0] if ranks[0] != even else None
            last = ranks[-1] if ranks[-1] != even else None
        elif pp == 2 and ranks[0] != ranks[1]:
            first = ranks[0]
        if min(counts) < 1:
            rule = "9dec370" if self.counted else "v0.2.2"
            made = (
                "given"
                if self.parts is not None or self.split_points is not None
                else f"torchtitan {rule} default"
            )
            raise InputError(
                f"{self.where}: the {made} split of {num_layers} layers into {stages} stages over {pp} ranks "
                f"(layers a stage: {describe_layer_counts(counts)}) leaves a stage without a layer, which "
                "is not modelled; accepted: every stage at least one layer (set "
                "parallelism.pipeline_parallel_split_points or module_fqns_per_model_part), or "
                "{pp_stage_layers} given"
            )
        megatron = (
            chunked
            and len(middle) <= 1
            and split_problem(num_layers, pp, vpp, first, last) is None
            and stage_layer_counts(num_layers, pp, first, last) == tuple(ranks)
        )
        values = {"vpp": str(vpp)} if vpp > 1 else {}
        if megatron:
            ends = (("pp_first_stage_layers", first), ("pp_last_stage_layers", last))
            values.update({name: str(n) for name, n in ends if n})
        else:
            values["pp_stage_layers"] = ",".join(map(str, counts))
        return values
