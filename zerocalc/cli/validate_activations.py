"""``zerocalc validate activations``: what real Hugging Face modules save for backward, measured on the CPU
(``saved_tensors_hooks``, storages deduplicated), against the hf model profile, region by region and to the
byte (needs transformers).

Thin: read the options, call :func:`zerocalc.validate.saved_measure.run_cases`, render. torch and
transformers are imported only once the command runs.
"""

from __future__ import annotations

from typing import Any

from zerocalc.base.errors import InputError
from zerocalc.cli.measure_options import Measure
from zerocalc.cli.options import comma_list, takes_measure
from zerocalc.cli.validate_common import finish, hf_config, require_torch, shape


@takes_measure(Measure.ACTIVATIONS)
def activations(values: dict[str, Any], given: frozenset[str]) -> None:
    """What real Hugging Face modules save for backward, on the CPU.

    Measure the saved tensors (saved_tensors_hooks, storages deduplicated) of tiny configs of every family,
    or of --model; compare them, region by region and to the byte, with the hf model profile (needs
    transformers). With --lora-rank (--quantize, --dora, --lora-dropout, --freeze, ...): the PEFT model
    (and the bitsandbytes 4-bit base) built on the CPU, against the fine-tuning forward's profile."""
    from types import SimpleNamespace

    from zerocalc.model.code import HF_EAGER_ONLY, TUNED_FAMILIES
    from zerocalc.request.finetune import finetune_of_options
    from zerocalc.request.options import FINETUNE_OPTIONS
    from zerocalc.validate.saved import ATTENTIONS, TINY_CONFIGS

    if values["compile"].strip().lower() != "none":
        compiled_cases(values, given)
        return
    for name in ("model_impl", "recompute", "fp8"):
        if name in given:
            flag = "--" + name.replace("_", "-")
            raise InputError(
                f"{flag} is read with --compile only; accepted: --compile model, loss or model,loss"
            )
    precision, attention, family = values["precision"], values["attention"], values["family"]
    finetune = finetune_of_options(SimpleNamespace(**{name: values.get(name) for name in FINETUNE_OPTIONS}))
    if finetune is not None:
        if finetune.quant is not None and finetune.quant.method.value == "int8":
            raise InputError(
                "{quantize} 'int8' is not measured here (LLM.int8's MatMul8bitFp); accepted: none, nf4, fp4"
            )
        if "attention" not in given:
            attention = "sdpa"
    dtypes = [
        {"fp32": "fp32", "bf16-mixed": "bf16"}[p]
        for p in comma_list(precision, "--precision", ("fp32", "bf16-mixed"), allow_all=False)
    ]
    attentions = comma_list(attention, "--attention", ATTENTIONS, allow_all=False)
    b, s = shape(values)
    if values["model"] is not None:
        if family.strip().lower() != "all":
            raise InputError(f"--family {family!r} with --model is not accepted; accepted: one of the two")
        models = [hf_config(values["model"], "activations")]
    elif finetune is not None:
        tuned = tuple(f for f in TINY_CONFIGS if f in TUNED_FAMILIES)
        models = [(f, TINY_CONFIGS[f]) for f in comma_list(family, "--family", tuned, True)]
    else:
        models = [(f, TINY_CONFIGS[f]) for f in comma_list(family, "--family", tuple(TINY_CONFIGS), True)]
    if finetune is not None:
        if "eager" in attentions:
            raise InputError(
                "--attention 'eager' is not accepted with fine-tuning (its forward is written out for SDPA); "
                "accepted: sdpa"
            )
        untuned = sorted({str(config.get("model_type")) for _, config in models} - TUNED_FAMILIES)
        if untuned:
            raise InputError(
                f"--model of {', '.join(untuned)} is not accepted with fine-tuning; accepted: a config.json "
                f"of {', '.join(sorted(TUNED_FAMILIES))}"
            )
    eager_only = sorted({str(config.get("model_type")) for _, config in models} & set(HF_EAGER_ONLY))
    if attentions == ["sdpa"] and len(eager_only) == len(models):
        raise InputError(
            f"--attention 'sdpa' is not accepted for {', '.join(eager_only)} (its transformers code has no "
            "SDPA: _supports_sdpa = False); accepted: eager"
        )
    require_torch(transformers="activations")
    if finetune is not None:
        import importlib.util

        needed = ["peft"] + (["bitsandbytes"] if finetune.quantized else [])
        missing = [name for name in needed if importlib.util.find_spec(name) is None]
        if missing:
            raise InputError(
                f"validate activations with fine-tuning needs {', '.join(missing)}; accepted: pip install "
                "'zerocalc[test]' (peft 0.21.2, bitsandbytes 0.50.2), or no fine-tuning option"
            )
    from zerocalc.validate import saved_measure

    report = saved_measure.run_cases(models, dtypes, attentions, [(b, s)], finetune)
    finish(report, values["json"], render_activations, report.all_match)


def compiled_cases(values: dict[str, Any], given: frozenset[str]) -> None:
    """``--compile``: the compiled step's saved tensors, measured with real Inductor on the CPU
    (:mod:`zerocalc.validate.compiled`), against :func:`zerocalc.validate.saved.predict_compiled_regions`."""
    from zerocalc.model.code import Compiled
    from zerocalc.validate.saved import TINY_CONFIGS

    accepted = ", ".join(c.value for c in Compiled if c is not Compiled.NONE)
    try:
        compiled = Compiled(",".join(p.strip() for p in values["compile"].lower().split(",")))
    except ValueError:
        raise InputError(
            f"--compile {values['compile']!r} is not accepted; accepted: none, {accepted}"
        ) from None
    for name in ("model", "lora_rank", "quantize", "freeze", "dora", "lora_dropout"):
        if name in given:
            raise InputError(
                f"--{name.replace('_', '-')} with --compile is not measured; accepted: the tiny configs "
                "(--family)"
            )
    if "attention" in given and values["attention"].strip().lower() != "sdpa":
        raise InputError(
            "--attention with --compile: the compiled saves are modelled for SDPA; accepted: sdpa"
        )
    codes = comma_list(values["model_impl"], "--model-impl", ("torchtitan", "hf"), allow_all=False)
    if compiled is Compiled.LOSS and "hf" in codes:
        raise InputError(
            "--compile loss with --model-impl hf: transformers' loss runs inside the model's forward; "
            "accepted: --model-impl torchtitan"
        )
    recomputes = comma_list(values["recompute"], "--recompute", ("none", "full", "op"), allow_all=False)
    fp8 = values["fp8"].strip().lower()
    if fp8 not in ("none", "tensorwise"):
        raise InputError(f"--fp8 {values['fp8']!r} is not accepted; accepted: none, tensorwise")
    if fp8 == "tensorwise" and (codes != ["torchtitan"] or not compiled.model):
        raise InputError(
            "--fp8 tensorwise is measured on torchtitan's compiled blocks; accepted: --model-impl torchtitan "
            "with --compile model or model,loss"
        )
    dtypes = [
        {"fp32": "fp32", "bf16-mixed": "bf16"}[p]
        for p in comma_list(values["precision"], "--precision", ("fp32", "bf16-mixed"), allow_all=False)
    ]
    from zerocalc.validate.compiled import COMPILED_FAMILIES

    families = comma_list(values["family"], "--family", COMPILED_FAMILIES, True)
    b, s = shape(values)
    require_torch(transformers="activations")
    from zerocalc.validate import compiled as measured

    models = [(f, TINY_CONFIGS[f]) for f in families]
    report = measured.run_cases(models, codes, dtypes, recomputes, compiled, [(b, s)], fp8 == "tensorwise")
    finish(report, values["json"], render_activations, report.all_match)


def render_activations(report) -> None:
    """One row per case (predicted and measured saved bytes), then the regions that differ."""
    from zerocalc.cli.render import Column, console, print_fitted

    out = console()
    out.print(
        f"Saved activations of one training forward, hf profile vs torch {report.torch} + transformers "
        f"{report.transformers} on the CPU (saved_tensors_hooks; bytes per storage)"
    )
    tunings = sorted({case.tuning for case in report.cases if case.tuning})
    if tunings:
        out.print(
            f"Fine-tuning: {', '.join(tunings)} (PEFT {report.peft}, bitsandbytes {report.bitsandbytes})"
        )
    if any(case.compiled for case in report.cases):
        out.print(
            "Compiled: torch.compile (Inductor on the CPU); torchtitan's final norm and head run eager, not "
            "compared"
        )
    keys, predicted, measured, difference, marks = [], [], [], [], []
    for case in report.cases:
        how = (
            case.compiled.replace(" --compile", "").replace(" --recompute", " recompute").replace(" --", " ")
        )
        how = how or case.attention
        keys.append(f"{case.model} {case.dtype} {how} b={case.micro_batch} s={case.seq_len}")
        predicted.append(f"{case.predicted:,}")
        measured.append(f"{case.measured:,}")
        difference.append(f"{case.measured - case.predicted:+,}")
        marks.append("exact" if case.exact else ("not claimed" if case.not_exact else "✗ OFF"))
    print_fitted(
        "case",
        keys,
        [
            Column(header="predicted", cells=predicted),
            Column(header="measured", cells=measured),
            Column(header="diff", cells=difference),
            Column(header="", cells=marks, justify="left"),
        ],
        key_width=24,
    )
    from rich.markup import escape

    notes: dict[str, list[str]] = {}
    for case in report.cases:
        if case.exact:
            continue
        title = f"{case.model} {case.dtype} {case.attention}"
        if case.not_exact:
            notes.setdefault(case.not_exact, []).append(f"{case.model} {case.attention}")
            continue
        for region in case.regions:
            if region.ok:
                continue
            out.print(
                f"[bold red]✗ {title}, {region.region}: predicted {region.predicted:,}, measured "
                f"{region.measured:,} ({region.difference:+,})[/bold red]"
            )
            for term in region.unmatched_terms:
                out.print(f"    predicted, not measured: {term.name} ({term.bytes:,} B)")
            for st in region.unmatched_storages:
                shape = "×".join(map(str, st.shape)) or "scalar"
                out.print(
                    f"    measured, not predicted: {st.dtype} {shape} ({st.bytes:,} B) saved by {st.saved_by}"
                )
    for reason, cases in notes.items():
        out.print(f"[dim]· not claimed exact ({', '.join(dict.fromkeys(cases))}): {escape(reason)}[/dim]")
    exact = sum(c.exact for c in report.cases)
    claimed = sum(c.not_exact is None for c in report.cases)
    verdict = "every claimed case is exact" if report.all_match else "[bold red]NOT all exact[/bold red]"
    out.print(f"{exact} of {len(report.cases)} cases exact to the byte ({claimed} claimed exact): {verdict}")
