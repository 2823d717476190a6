"""The variant registry: each variant is a named chain of passes with the conditions it needs."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.choices import Precision, Target, VariantName
from kiln.decoder.graph import CacheShape
from kiln.optimizing import onnx_passes, openvino_passes, torch_passes
from kiln.optimizing.context import BuildContext, BuiltVariant
from kiln.optimizing.sensitivity import Int8Mode, RankedLayer, rank_layers
from kiln.records.artifact import EngineHints
from kiln.tasks import DECODER_FUSION

Builder = Callable[..., BuiltVariant]  # (context, nodes to keep in fp32, **tuning parameters) -> variant
# (context, calibration batches) -> (layer name, int8 error) worst first, in the names the variant's quantizer takes
Ranker = Callable[[BuildContext, list[dict[str, np.ndarray]]], list[RankedLayer]]


@dataclass(frozen=True)
class VariantSpec:
    name: str
    build: Builder  # (context, nodes to keep in fp32) -> variant
    targets: frozenset[Target]  # targets that build it by default
    why_not: Callable[[BuildContext], str | None] = lambda ctx: None  # reason it cannot be built here
    rank: Ranker | None = None  # int8 variants: their layers by int8 sensitivity, for the exclusion search
    # int8 variants: the float variant whose graph they quantize; its time bounds the layers the search may keep in
    # fp32 (kiln.optimizing.sensitivity.paying_limit).
    quantizes: Callable[[BuildContext], str] | None = None
    # Parameter sets tried in order when the default build fails the gate, before any layer is excluded.
    alternatives: tuple[dict[str, Any], ...] = ()
    # Why the variant is left out of the defaults on this machine (still built when named in --variants).
    not_by_default: Callable[[BuildContext], str | None] = lambda ctx: None
    # Whether its build reads the PyTorch model beyond the shared fp32 ONNX export (kiln optimize frees the model's
    # weights once no variant left to build does).
    needs_model: Callable[[BuildContext], bool] = lambda ctx: False
    # Why no task but those that decode step by step may ask for it (empty: any task may).
    decoders_only: str = ""


def _onnx_file(ctx: BuildContext, name: str, recipe: list, path: Path) -> BuiltVariant:
    rel = path.relative_to(ctx.stage).as_posix()
    return BuiltVariant(name, "onnxruntime", rel, [rel], recipe)


def _fp32(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    return ctx.fp32_onnx()


def _fusion_shape(ctx: BuildContext) -> onnx_passes.FusionShape:
    from kiln.model import layout

    model = ctx.source.model
    if not hasattr(model.config, layout.CONFIG_KEY):
        return onnx_passes.FusionShape(int(model.config.num_attention_heads), int(model.config.hidden_size))
    heads = {len(h) for h in layout.current_shape(model).heads}
    size = layout.head_dim(model, layout.layers(model)[0])
    count = heads.pop() if len(heads) == 1 else 0
    return onnx_passes.FusionShape(count, count * size, attention=count > 0)


def _bert_fusion(ctx: BuildContext, path: Path, gelu_approximation: bool) -> list[dict]:
    """ONNX Runtime's transformer fusions on the fp32 export."""
    step = onnx_passes.fuse(ctx.stage / _fp32(ctx).path, path, _fusion_shape(ctx),
                            gelu_approximation=gelu_approximation)
    return [*_fp32(ctx).recipe, step]


def _decoder_fusion(ctx: BuildContext, path: Path, gelu_approximation: bool) -> list[dict]:
    """kiln's own step graph, written from the weights: fused attention, the cache updated in place."""
    from kiln.exporting.fused_decoder import build_fused_decoder, fused_recipe

    return fused_recipe(build_fused_decoder(ctx.source.model, path))


# TaskSpec.fusion -> how a task's onnx-fused graph is made: (context, path, gelu approximation) -> its recipe.
FUSIONS: dict[str, Callable[[BuildContext, Path, bool], list[dict]]] = {
    "bert": _bert_fusion, DECODER_FUSION: _decoder_fusion}


def _fusion_why_not(ctx: BuildContext) -> str | None:
    if ctx.spec.export.fusion == DECODER_FUSION:
        from kiln.exporting.fused_decoder import why_not

        return why_not(ctx.source.model.config)
    return None


def _fused_path(ctx: BuildContext, gelu_approximation: bool = False) -> tuple[Path, list[dict]]:
    name = "onnx-fused-gelu-approx" if gelu_approximation else "onnx-fused"

    def build() -> tuple[Path, list[dict]]:
        path = ctx.variant_dir(name) / "model.onnx"
        return path, FUSIONS[ctx.spec.export.fusion](ctx, path, gelu_approximation)
    return ctx.once(name, build)


def _fused(ctx: BuildContext, exclude: Sequence[str] = (), gelu: bool = False) -> BuiltVariant:
    path, recipe = _fused_path(ctx, gelu)
    built = _onnx_file(ctx, path.parent.name, recipe, path)
    files = [f.relative_to(ctx.stage).as_posix() for f in sorted(path.parent.iterdir())]
    return dataclasses.replace(built, files=files)


def _int4_weights(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    """kiln's fused step graph written with 4-bit weights (MatMulNBits), the layers ``exclude`` names in fp32.
    Activations are quantized to int8 per block for the product (accuracy level 4, ONNX Runtime GenAI's own CPU
    int4): on SmolLM2-135M's shape 10.8 ms a token against 23.2 with fp32 activations and 32.3 for fp32 weights
    (batch 1 after 128 tokens, 2-core AVX2 EPYC); on the Llama trained here the same gate figures (every MatMul
    0.9440 against 0.9436; searched 0.9550 at perplexity 127.92 against 0.9566 at 127.90), at a cost: a row's
    logits move by up to 1.7e-2 between batchings (next tokens agree at 0.9992), where fp32 activations moved
    6e-6."""
    from kiln.exporting.fused_decoder import WeightFormat, build_fused_decoder, fused_recipe

    path = ctx.variant_dir("onnx-int4-weights") / "model.onnx"
    weights = WeightFormat(bits=4, keep=frozenset(exclude), accuracy_level=4)
    files = build_fused_decoder(ctx.source.model, path, weights)
    built = _onnx_file(ctx, path.parent.name, [*fused_recipe(files), weights.recipe()], path)
    return dataclasses.replace(built, files=[f.relative_to(ctx.stage).as_posix() for f in files])


INT4_FOR_DECODERS = ("weight-only int4 is built for decoders, whose generation steps read every weight per token; "
                     "an encoder's batches are compute-bound")


def _int8_source(ctx: BuildContext) -> tuple[Path, list[dict]]:
    """What dynamic int8 quantizes: the fused graph, or the plain export where no fused graph can be built."""
    if _fusion_why_not(ctx):
        return ctx.stage / _fp32(ctx).path, list(_fp32(ctx).recipe)
    return _fused_path(ctx)


def _int8_source_name(ctx: BuildContext) -> str:
    return "onnx-fp32" if _fusion_why_not(ctx) else "onnx-fused"


def _decoder_fuses(ctx: BuildContext) -> bool:
    """Whether the model is a decoder whose onnx-fused step graph can be written."""
    return ctx.spec.export.fusion == DECODER_FUSION and _fusion_why_not(ctx) is None


def _fp32_superseded(ctx: BuildContext) -> str | None:
    """A decoder's onnx-fp32 is left out of the defaults where onnx-fused can be built: the same fp32 weights, with
    the cache updated in place. Its export is still made, as the artifact's reference and OpenVINO's source."""
    if _decoder_fuses(ctx):
        return "onnx-fused runs the same fp32 weights with the cache updated in place; the export is kept as the " \
               "reference"
    return None


def _openvino_decoder_superseded(ctx: BuildContext) -> str | None:
    """A decoder's OpenVINO variants are left out of the defaults where onnx-fused can be built: each step hands
    OpenVINO's stateless graph the whole cache and takes it back, and on SmolLM2-135M's shape (avx2,
    benchmarks/RESULTS.md, Decoders) openvino-int8-weights took 44.0 ms a token at batch 1 after 128 tokens and
    117.6 after 1,024 against onnx-fused's fp32 30.1 and 29.8, openvino-int4-weights 41.9 against onnx-int4-weights'
    11.1, so none could be chosen; at ~3 minutes a variant they were an estimated 9 of the ~25 minutes of Qwen3-0.6B's
    optimize."""
    if _decoder_fuses(ctx):
        return "onnx-fused and onnx-int4-weights decode faster than OpenVINO's stateless step graph; name it in " \
               "--variants to build it"
    return None


def _int8_dynamic(ctx: BuildContext, exclude: Sequence[str] = (), name: str = "onnx-int8-dynamic") -> BuiltVariant:
    source, steps = _int8_source(ctx)
    path = ctx.variant_dir(name) / "model.onnx"
    step = onnx_passes.quantize_dynamic_int8(source, path, ctx.scheme, per_channel=True, exclude=exclude)
    return _onnx_file(ctx, name, [*steps, step], path)


def _int8_dynamic_rows(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    """Dynamic int8 with each input run on its own: its activation scales see that input alone (batch-invariant)."""
    built = _int8_dynamic(ctx, exclude, name="onnx-int8-dynamic-rows")
    return dataclasses.replace(built, recipe=[*built.recipe, {"pass": "rows-alone"}],
                               options=EngineHints(rows_alone=True))


def _int8_static(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    path = ctx.variant_dir("onnx-int8-static") / "model.onnx"
    cache = ctx.scratch / f"ort-calibration-{ctx.calibration_method}.json" if ctx.scratch else None
    step = onnx_passes.quantize_static_int8(ctx.stage / _fp32(ctx).path, path, ctx.calibration_batches(),
                                            ctx.scheme, method=ctx.calibration_method, exclude=exclude,
                                            cache=cache)
    return _onnx_file(ctx, "onnx-int8-static", [*_fp32(ctx).recipe, step], path)


def _fp16(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    fused, fuse_steps = _fused_path(ctx)
    path = ctx.variant_dir("onnx-fp16") / "model.onnx"
    step = onnx_passes.to_fp16(fused, path)
    return _onnx_file(ctx, "onnx-fp16", [*fuse_steps, step], path)


def _ov_files(rel_xml: str) -> list[str]:
    return [rel_xml, rel_xml.removesuffix(".xml") + ".bin"]


def _openvino_fp32_ir(ctx: BuildContext) -> BuiltVariant:
    def build() -> BuiltVariant:
        path = ctx.variant_dir("openvino-fp32") / "model.xml"
        step = openvino_passes.convert(ctx.stage / _fp32(ctx).path, path)
        rel = path.relative_to(ctx.stage).as_posix()
        return BuiltVariant("openvino-fp32", "openvino", rel, _ov_files(rel), [*_fp32(ctx).recipe, step])
    return ctx.once("openvino-fp32", build)


def _openvino_fp32(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    return _openvino_fp32_ir(ctx)


def _openvino_bf16(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    ir = _openvino_fp32_ir(ctx)
    return BuiltVariant("openvino-bf16", "openvino", ir.path, ir.files,
                        [*ir.recipe, {"pass": "runtime-hint", "inference_precision": "bf16"}],
                        EngineHints(Precision.BF16))


def _openvino_int8(ctx: BuildContext, exclude: Sequence[str] = (), smooth_quant_alpha: float | None = None
                   ) -> BuiltVariant:
    ir = _openvino_fp32_ir(ctx)
    path = ctx.variant_dir("openvino-int8-static") / "model.xml"
    step = openvino_passes.quantize_int8(ctx.stage / ir.path, path, ctx.calibration_batches(), ignored=exclude,
                                         smooth_quant_alpha=smooth_quant_alpha)
    rel = path.relative_to(ctx.stage).as_posix()
    recipe = [*ir.recipe, step]
    options = EngineHints()
    if ctx.cpu.has_bf16:  # the layers NNCF leaves in float run in bf16 where the CPU has it
        recipe.append({"pass": "runtime-hint", "inference_precision": "bf16"})
        options = EngineHints(Precision.BF16)
    return BuiltVariant("openvino-int8-static", "openvino", rel, _ov_files(rel), recipe, options)


def _openvino_int8_weights(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    ir = _openvino_fp32_ir(ctx)
    path = ctx.variant_dir("openvino-int8-weights") / "model.xml"
    step = openvino_passes.compress_weights_int8(ctx.stage / ir.path, path, ignored=exclude)
    rel = path.relative_to(ctx.stage).as_posix()
    return BuiltVariant("openvino-int8-weights", "openvino", rel, _ov_files(rel), [*ir.recipe, step])


def _openvino_int4_weights(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    ir = _openvino_fp32_ir(ctx)
    path = ctx.variant_dir("openvino-int4-weights") / "model.xml"
    step = openvino_passes.compress_weights_int4(ctx.stage / ir.path, path, group_size=_int4_group(ctx),
                                                 ignored=exclude)
    rel = path.relative_to(ctx.stage).as_posix()
    return BuiltVariant("openvino-int4-weights", "openvino", rel, _ov_files(rel), [*ir.recipe, step])


def _int4_group(ctx: BuildContext) -> int:
    """NNCF's default group of 128 input channels, or the largest of 64 and 32 that divides every projection's
    input size (a group may not straddle a row's end)."""
    config = ctx.source.model.config
    hidden = int(config.hidden_size)
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden  # GPT-2's
    sizes = {hidden, int(ffn), int(config.num_attention_heads) * CacheShape.of(config).head_size}
    return next((g for g in (128, 64, 32) if all(n % g == 0 for n in sizes)), 32)


def _weights_only_pays(ctx: BuildContext) -> str | None:
    if ctx.spec.export.weight_only_int8_pays:
        return None
    return ("weight-only int8 pays where decoding reads every weight per token; an encoder's batches are "
            "compute-bound (openvino-int8-static quantizes activations too); name it in --variants to build it")


def _torchscript(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    from kiln.exporting.torchscript import export_torchscript

    path = ctx.variant_dir("torchscript") / "model.pt"
    export_torchscript(ctx.module(), ctx.example(), path, device=ctx.device)
    rel = path.relative_to(ctx.stage).as_posix()
    return BuiltVariant("torchscript", "torchscript", rel, [rel],
                        [{"pass": "export-torchscript", "method": "trace+freeze", "device": ctx.device}])


def _torch_weights(ctx: BuildContext) -> tuple[str, list[str], dict]:
    def build():
        directory = ctx.variant_dir("torch")
        step = torch_passes.save_weights(ctx.source, ctx.module(), directory)
        files = sorted(p.relative_to(ctx.stage).as_posix() for p in directory.iterdir())
        return "torch", files, step
    return ctx.once("torch-weights", build)


def _torch_autocast(precision: Precision) -> Builder:
    def build(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
        rel, files, step = _torch_weights(ctx)
        return BuiltVariant(f"torch-{precision.value}", "torch", rel, files,
                            [step, {"pass": "autocast", "dtype": precision.value}], EngineHints(precision))
    return build


def _torch_int8(ctx: BuildContext, exclude: Sequence[str] = ()) -> BuiltVariant:
    path = ctx.variant_dir("torch-int8-dynamic") / "model.pt"
    step = torch_passes.quantize_dynamic_int8(ctx.module(), ctx.example(), path)
    rel = path.relative_to(ctx.stage).as_posix()
    return BuiltVariant("torch-int8-dynamic", "torchscript", rel, [rel], [step])


def _needs_openvino(ctx: BuildContext) -> str | None:
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError as err:
        return f"openvino/nncf not installed ({err}); pip install 'kiln[openvino]'"
    return None


def _needs_bf16(ctx: BuildContext) -> str | None:
    if not ctx.cpu.has_bf16:
        return f"this CPU has no native bf16 (AVX-512 BF16 or AMX); features: {', '.join(ctx.cpu.features)}"
    return None




def _needs_openvino_bf16(ctx: BuildContext) -> str | None:
    return _needs_openvino(ctx) or _needs_bf16(ctx)


def _openvino_int8_kernels(ctx: BuildContext) -> str | None:
    # Profiled on a 2-core AVX2 EPYC (PERF_COUNT, 32x128 batch): without VNNI/AMX the CPU plugin runs int8
    # MatMuls on oneDNN's jit_gemm_i8 instead of brgemm, and the attention falls out of its fused kernel;
    # the int8 IR ran 51.5 seq/s against 57.6 for openvino-fp32 on the same texts, so building it (and its
    # sensitivity search) only costs time there. ONNX Runtime's MLAS has AVX2 u8s8 kernels and does pay.
    if ctx.cpu.arch in ("x86_64", "amd64") and not ctx.cpu.has_vnni:
        return ("OpenVINO has no fast int8 kernels on this CPU without VNNI/AMX (measured no faster than "
                "openvino-fp32); name it in --variants to build it anyway")
    return None


def _needs_cuda_for_fp16_speed(ctx: BuildContext) -> str | None:
    return None  # builds anywhere; only chosen by default for --target cuda (CPU fp16 kernels are slow)


def _ranked_onnx(graph: Callable[[BuildContext], Path], mode: Int8Mode) -> Ranker:
    """Layers of the ONNX graph ``graph`` builds, by the int8 error ``mode`` makes in each."""
    return lambda ctx, batches: rank_layers(graph(ctx), batches, mode=mode)


def _ranked_ir(mode: Int8Mode) -> Ranker:
    """Layers of the fp32 OpenVINO IR, by their IR names (the names NNCF's ignored scope takes)."""
    return lambda ctx, batches: openvino_passes.rank_ir_layers(ctx.stage / _openvino_fp32_ir(ctx).path, batches,
                                                               mode=mode)


def _fusing(graph: str = "onnx-fused") -> Callable[[BuildContext], bool]:
    """Whether a build still fuses ``graph``: the BERT fusions read the model's shape (heads, a pruned model's
    layout), a decoder's fused graph its weights, until that graph exists."""
    return lambda ctx: not ctx.built(graph) and _fusion_why_not(ctx) is None


def _always(ctx: BuildContext) -> bool:
    return True


CPU = frozenset({Target.CPU})
ALL = frozenset(Target)
VARIANTS: dict[VariantName, VariantSpec] = {VariantName(spec.name): spec for spec in (
    VariantSpec("onnx-fp32", _fp32, ALL, not_by_default=_fp32_superseded),
    VariantSpec("onnx-fused", _fused, ALL, _fusion_why_not, needs_model=_fusing()),
    VariantSpec("onnx-fused-gelu-approx", lambda ctx, ex=(): _fused(ctx, ex, gelu=True), ALL,
                needs_model=_fusing("onnx-fused-gelu-approx")),
    VariantSpec("onnx-int8-dynamic", _int8_dynamic, CPU,
                rank=_ranked_onnx(lambda ctx: _int8_source(ctx)[0], Int8Mode.DYNAMIC), quantizes=_int8_source_name,
                needs_model=_fusing()),
    VariantSpec("onnx-int8-dynamic-rows", _int8_dynamic_rows, CPU,
                rank=_ranked_onnx(lambda ctx: _int8_source(ctx)[0], Int8Mode.DYNAMIC), quantizes=_int8_source_name,
                needs_model=_fusing()),
    VariantSpec("onnx-int8-static", _int8_static, CPU,
                rank=_ranked_onnx(lambda ctx: ctx.stage / _fp32(ctx).path, Int8Mode.STATIC),
                quantizes=lambda ctx: "onnx-fp32"),
    VariantSpec("onnx-int4-weights", _int4_weights, CPU, _fusion_why_not, needs_model=_always,
                decoders_only=INT4_FOR_DECODERS,
                rank=_ranked_onnx(lambda ctx: _fused_path(ctx)[0], Int8Mode.INT4_WEIGHTS),
                quantizes=lambda ctx: "onnx-fused"),
    VariantSpec("openvino-fp32", _openvino_fp32, CPU, _needs_openvino, not_by_default=_openvino_decoder_superseded),
    VariantSpec("openvino-bf16", _openvino_bf16, CPU, _needs_openvino_bf16),
    VariantSpec("openvino-int8-static", _openvino_int8, CPU, _needs_openvino, not_by_default=_openvino_int8_kernels,
                rank=_ranked_ir(Int8Mode.STATIC), quantizes=lambda ctx: "openvino-fp32",
                alternatives=tuple({"smooth_quant_alpha": a} for a in (0.8, 0.7, 0.6, 0.5))),
    VariantSpec("openvino-int8-weights", _openvino_int8_weights, CPU, _needs_openvino,
                not_by_default=lambda ctx: _weights_only_pays(ctx) or _openvino_decoder_superseded(ctx),
                rank=_ranked_ir(Int8Mode.WEIGHTS), quantizes=lambda ctx: "openvino-fp32"),
    VariantSpec("openvino-int4-weights", _openvino_int4_weights, CPU, _needs_openvino,
                decoders_only=INT4_FOR_DECODERS, not_by_default=_openvino_decoder_superseded,
                rank=_ranked_ir(Int8Mode.INT4_WEIGHTS), quantizes=lambda ctx: "openvino-fp32"),
    VariantSpec("onnx-fp16", _fp16, frozenset({Target.CUDA}), needs_model=_fusing()),
    VariantSpec("torchscript", _torchscript, ALL, needs_model=_always),
    VariantSpec("torch-bf16", _torch_autocast(Precision.BF16), CPU, _needs_bf16, needs_model=_always),
    VariantSpec("torch-fp16", _torch_autocast(Precision.FP16), frozenset({Target.CUDA}), needs_model=_always),
    VariantSpec("torch-int8-dynamic", _torch_int8, CPU, needs_model=_always),
)}


def default_variants(target: str, task: str | None = None) -> list[str]:
    from kiln.tasks import task_spec

    allowed = task_spec(task).export.variants if task else None
    return [name for name, spec in VARIANTS.items() if target in spec.targets
            and (name in allowed if allowed is not None else not spec.decoders_only)]


def remove_variant_files(ctx: BuildContext, name: str) -> None:
    """Drop a variant's own directory (shared intermediates stay)."""
    shutil.rmtree(ctx.stage / name, ignore_errors=True)
