"""``zerocalc validate fake``: real FSDP2 steps of a real Hugging Face model at any world size, on the CPU,
under fake tensors and a fake process group, tracked by PyTorch's FSDPMemTracker; each phase's allocated
bytes against the step timeline, exactly. ``--tp``: DTensor TP + FSDP2 on dp × tp meshes, the model states
against zerocalc/validate/tp.py. (Pipeline stages under fake tensors: ``validate pipeline --fake``.)

Thin: read the options, call :func:`zerocalc.validate.fake_step.run_cases`, render. torch and
transformers are imported only once the command runs.
"""

from __future__ import annotations

from typing import Any

from zerocalc.base.errors import InputError
from zerocalc.cli.measure_options import Measure
from zerocalc.cli.options import comma_list, takes_measure, whole_number
from zerocalc.cli.validate_common import MAX_RANKS, finish, require_torch, reshards, shape


def _tps(text: str) -> list[int]:
    """``--tp``: a comma list of whole numbers ≥ 1."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and 1 <= int(p) <= MAX_RANKS for p in parts):
        raise InputError(f"--tp {text!r} is not accepted; accepted: a comma list of whole numbers ≥ 1")
    return list(dict.fromkeys(int(p) for p in parts))


@takes_measure(Measure.FAKE)
def fake(values: dict[str, Any], given: frozenset[str]) -> None:
    """FSDP2 (and DTensor TP) at any world size, on the CPU, under fake tensors.

    Run real FSDP2 steps (with --tp: DTensor TP + FSDP2) of a real Hugging Face model under fake tensors
    and a fake process group of --world ranks (FSDPMemTracker); compare each phase's allocated bytes with
    the step timeline, exactly (needs transformers). Without --model: a tiny Llama."""
    from zerocalc.model.activations import Recompute
    from zerocalc.model.code import OutputKept
    from zerocalc.parallel.precision import Fp8RecipeName
    from zerocalc.request.values import choice
    from zerocalc.validate.fake import RECOMPUTES, FakeCase, request_for
    from zerocalc.validate.tp import check_tp_model

    model, world = values["model"], values["world"]
    tps = _tps(values["tp"])
    if tps == [1]:
        for name in ("sequence_parallel", "loss_parallel"):
            if name in given:
                flag = f"--{'' if values[name] else 'no-'}{name.replace('_', '-')}"
                raise InputError(f"{flag} without --tp is not accepted; accepted: --tp 2 or more with it")
    worlds = []
    for text in world.split(","):
        size = text.strip()
        if not size.isdigit() or not 1 <= int(size) <= MAX_RANKS:
            raise InputError(
                f"--world {world!r} is not accepted; accepted: a comma list of world sizes from 1 to "
                f"{MAX_RANKS:,}"
            )
        worlds.append(int(size))
    accepted = tuple(r.value for r in RECOMPUTES)
    recomputes = [Recompute(r) for r in comma_list(values["recompute"], "--recompute", accepted, False)]
    resharding = reshards(values["reshard"])
    micro_batch, seq_len = shape(values, at_most=None)
    for w in worlds:
        for t in tps:
            if w % t:
                raise InputError(
                    f"--tp {t} does not divide --world {w}; accepted: tensor-parallel sizes dividing every "
                    "world size (dp = world / tp)"
                )
    sp, lp = values["sequence_parallel"], values["loss_parallel"]
    for t in tps:
        if t > 1 and sp and seq_len % t:
            raise InputError(
                f"--seq-len {seq_len:,} does not split into --tp {t} sequence-parallel chunks; accepted: "
                f"--seq-len a multiple of {t} (or --no-sequence-parallel)"
            )
    fp8 = _fp8(values["fp8"], values["fp8_all_gather"], tps)
    lora = whole_number(values["lora_rank"], "--lora-rank") or 0
    if lora and (max(tps) > 1 or fp8 is not Fp8RecipeName.NONE):
        raise InputError("--lora-rank with --tp or --fp8: not built here; accepted: --tp 1, --fp8 none")
    keep_output = choice(values["keep_output"], "--keep-output", OutputKept)
    if keep_output is not OutputKept.NONE and max(tps) > 1:
        raise InputError(f"--keep-output {keep_output.value} with --tp: not built here; accepted: --tp 1")
    name, config, arch = _fake_model(model, tp=max(tps) > 1)
    cases = [
        FakeCase(
            model=name, world=w, micro_batch=micro_batch, seq_len=seq_len, recompute=r, reshard=rs, tp=t,
            sequence_parallel=sp, loss_parallel=lp, fp8=fp8, fp8_all_gather=values["fp8_all_gather"],
            lora_rank=lora, keep_output=keep_output,
        )
        for w in dict.fromkeys(worlds)
        for t in tps
        for r in recomputes
        for rs in resharding
    ]  # fmt: skip
    for t in tps:
        if t > 1:
            check_tp_model(arch, t)
    plain = [case for case in cases if case.tp == 1]
    requests = [request_for(arch, case) for case in plain]  # every option checked before the first run
    require_torch(transformers="fake")
    from zerocalc.validate import fake_step

    report = fake_step.run_cases(
        config,
        list(zip(plain, requests, strict=True)),
        tuple((case, arch) for case in cases if case.tp > 1),
    )
    finish(report, values["json"], render_fake, report.all_match)


def _fp8(text: str, all_gather: bool, tps: list[int]):
    """``--fp8``: none or one of torchao's recipes (its FP8 all-gather tensorwise only, without --tp)."""
    from zerocalc.parallel.precision import FP8_RECIPES, Fp8Library, Fp8RecipeName

    torchao = [name for name, recipe in FP8_RECIPES.items() if recipe.library is Fp8Library.TORCHAO]
    accepted = ", ".join(["none", *(r.value for r in torchao)])
    recipe = next((r for r in (Fp8RecipeName.NONE, *torchao) if r.value == text.strip().lower()), None)
    if recipe is None:
        raise InputError(f"--fp8 {text!r} is not accepted; accepted: {accepted} (torchao's recipes)")
    if all_gather and recipe is not Fp8RecipeName.TENSORWISE:
        raise InputError(
            f"--fp8-all-gather with --fp8 {recipe.value}: torchao all-gathers fp8 weights with tensorwise "
            "scaling only; accepted: --fp8 tensorwise"
        )
    if recipe is not Fp8RecipeName.NONE and max(tps) > 1:
        raise InputError(f"--fp8 {recipe.value} with --tp: not built here; accepted: --tp 1")
    return recipe


def _fake_model(model: str | None, tp: bool = False):
    """The model's name, its config.json dict (what transformers builds) and its architecture: the tiny
    Llama of ``validate activations`` without ``--model`` (with ``tp``: untied, 8 key/value heads, which TP
    up to 8 ranks splits), else a config.json, a preset or a model TOML file."""
    from pathlib import Path

    from zerocalc.model.hf_config import _load, architecture_from_hf_dict
    from zerocalc.validate.saved import TINY_CONFIGS

    if model is None:
        config = TINY_CONFIGS["llama"]
        name = "tiny llama"
        if tp:
            config = dict(config, tie_word_embeddings=False, num_key_value_heads=8)
            name = "tiny llama (untied, 8 kv heads)"
        return name, config, architecture_from_hf_dict(config, f"the {name}", name)
    from zerocalc.request.presets import load_model, model_file
    from zerocalc.validate.hf_export import hf_config_of

    path = Path(model).expanduser()
    if model.endswith(".json") or (path.is_file() and model_file(model) != ("toml", path)):
        config = _load(path)
        name = path.parent.name or path.stem
        return name, config, architecture_from_hf_dict(config, f"--model {model!r}", name)

    arch, _ = load_model(model)
    return model, hf_config_of(arch, f"--model {model!r}"), arch


def render_fake(report) -> None:
    """Per case: each line's timeline bytes (CUDA extras left out), the tracker's, the difference; the
    CUDA extras named under the table."""
    from rich.markup import escape

    from zerocalc.cli.render import Column, console, print_fitted

    out = console()
    out.print(
        f"FSDP2 steps under fake tensors (torch {report.torch}, transformers {report.transformers}, CPU, "
        "FSDPMemTracker, storages rounded to 512 B) against the step timeline"
    )
    for case in report.cases:
        lines = case.lines
        print_fitted(
            "line",
            [line.line for line in lines],
            [
                Column(header="predicted", cells=[f"{line.predicted:,}" for line in lines]),
                Column(header="tracker", cells=[f"{line.measured:,}" for line in lines]),
                Column(header="diff", cells=[f"{line.measured - line.predicted:+,}" for line in lines]),
                Column(header="", cells=[_mark(line.ok, case.not_claimed) for line in lines], justify="left"),
            ],
            title=f"{case.case.title} ({case.seconds:g} s)",
            key_width=17,
        )
        if case.not_claimed and not case.exact:
            out.print(f"[dim]· not claimed exact: {escape(case.not_claimed)}[/dim]")
        extras = "; ".join(
            f"{extra.name} {extra.count} × {extra.bytes:,} B ({extra.lifetime})" for extra in case.cuda_extras
        )
        out.print(
            f"[dim]· predicted leaves out what only a CUDA step allocates (zerocalc memory adds it: "
            f"+{max(case.cuda_added):,} B at most): {extras}[/dim]"
        )
    for tp_case in report.tp_cases:
        _render_fake_tp(tp_case)
    verdict = "every claimed case is exact" if report.all_match else "[bold red]NOT all exact[/bold red]"
    if report.cases:
        exact = sum(case.exact for case in report.cases)
        claimed = sum(case.not_claimed is None for case in report.cases)
        total = len(report.cases)
        out.print(f"{exact} of {total} cases exact to the byte ({claimed} claimed exact): {verdict}")
    if report.tp_cases:
        exact = sum(case.exact for case in report.tp_cases)
        out.print(
            f"{exact} of {len(report.tp_cases)} dp × tp cases with model states exact to the byte: {verdict}"
        )


def _render_fake_tp(result) -> None:
    """A dp × tp case: the model states against zerocalc/validate/tp.py, then the tracker's phases."""
    from zerocalc.cli.render import Column, console, print_fitted
    from zerocalc.validate.phases import ALLOCATED_LINES

    lines = result.lines
    phases = [(label, getattr(result.phases, field)) for label, field in ALLOCATED_LINES]
    blank = [""] * len(phases)
    tracked = [f"{value:,}" for _, value in phases]
    print_fitted(
        "line",
        [line.line for line in lines] + [label for label, _ in phases],
        [
            Column(header="predicted", cells=[f"{line.predicted:,}" for line in lines] + ["—"] * len(phases)),
            Column(header="tracker", cells=[f"{x.measured:,}" for x in lines] + tracked),
            Column(header="diff", cells=[f"{line.measured - line.predicted:+,}" for line in lines] + blank),
            Column(header="", cells=["✓" if line.ok else "✗ OFF" for line in lines] + blank, justify="left"),
        ],
        title=f"{result.case.title} ({result.seconds:g} s)",
        key_width=17,
    )
    console().print(
        "[dim]· model states on rank 0 (zerocalc/validate/tp.py, storages rounded to 512 B); the phases as "
        "the tracker gives them: the step timeline does not model TP activations[/dim]"
    )


def _mark(ok: bool, not_claimed: str | None) -> str:
    if ok:
        return "✓"
    return "~ not claimed" if not_claimed else "✗ OFF"
