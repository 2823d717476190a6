"""Where each architecture keeps its attention heads and FFN neurons, and how kiln cuts them out physically.

A head is a block of ``head_dim`` output rows in each of the query/key/value projections and the same block of
input columns in the attention output projection; an FFN neuron is one output row of the first FFN linear (two
for a gated FFN: input and gate) and one input column of the second. Cutting those rows and columns shrinks the
dense matrices themselves, so every engine after export runs smaller GEMMs.

transformers configs hold one head count and one FFN width for all layers, and derive the head size from the
head count, so a model with heads pruned (or a different FFN width per layer) cannot be described by its config
alone. kiln writes the kept shape into config.json under ``kiln_pruning`` (kept head indices and FFN width per
layer); :func:`load_pruned` builds the model from its config, cuts it to that shape and loads the weights.
Where the result *is* expressible (every layer keeps all heads and the same FFN width), the config's
``intermediate_size`` is rewritten instead and the directory loads in transformers and sentence-transformers
as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import ModelLoadError, UsageError

CONFIG_KEY = "kiln_pruning"


@dataclass(frozen=True)
class Layout:
    """Paths of a layer's prunable parts, relative to the layer module (``a.b.c`` attribute paths)."""

    layers: str  # the layer list, relative to the base model
    attention: str  # the module holding the head count (its attributes in ``head_count`` are rewritten)
    head_dim: str  # attribute of ``attention`` with the size of one head
    head_count: tuple[str, ...]  # attributes of ``attention`` that hold the number of heads
    projections: tuple[str, ...]  # linears whose output rows are grouped by head (absent ones are skipped)
    attention_out: str  # linear whose input columns are grouped by head
    ffn_in: str  # linear whose output rows are neurons
    ffn_out: str  # linear whose input columns are neurons
    fused_qkv: bool = False  # ``projections`` is one linear with [q | k | v] output rows
    gated_ffn: bool = False  # ``ffn_in`` has [input | gate] output rows, one of each per neuron
    ffn_gate: str | None = None  # a gate linear of its own (SwiGLU as Llama writes it): its output rows are neurons too
    all_head_size: str | None = "all_head_size"  # attribute of ``attention`` = heads x head_dim
    position_bias: bool = False  # MPNet: one relative-position bias for all layers' heads, sliced per layer


_BERT = Layout("encoder.layer", "attention.self", "attention_head_size", ("num_attention_heads",),
               ("attention.self.query", "attention.self.key", "attention.self.value"),
               "attention.output.dense", "intermediate.dense", "output.dense")
_LLAMA_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
_ROTARY_GATED = Layout("layers", "self_attn", "head_dim", (), _LLAMA_QKV, "self_attn.o_proj", "mlp.up_proj",
                       "mlp.down_proj", ffn_gate="mlp.gate_proj", all_head_size=None)
LAYOUTS: dict[str, Layout] = {
    "bert": _BERT, "roberta": _BERT, "xlm-roberta": _BERT, "camembert": _BERT, "electra": _BERT,
    "distilbert": Layout("transformer.layer", "attention", "attention_head_size", ("n_heads",),
                         ("attention.q_lin", "attention.k_lin", "attention.v_lin"), "attention.out_lin",
                         "ffn.lin1", "ffn.lin2", all_head_size=None),
    # ALBERT's one shared layer: pruning it prunes every application of it alike.
    "albert": Layout("encoder.albert_layer_groups.0.albert_layers", "attention", "attention_head_size",
                     ("num_attention_heads",), ("attention.query", "attention.key", "attention.value"),
                     "attention.dense", "ffn", "ffn_output"),
    "mpnet": Layout("encoder.layer", "attention.attn", "attention_head_size", ("num_attention_heads",),
                    ("attention.attn.q", "attention.attn.k", "attention.attn.v"), "attention.attn.o",
                    "intermediate.dense", "output.dense", position_bias=True),
    # DeBERTa-v2 projects relative positions with the same query/key linears (share_att_key) or its own.
    "deberta-v2": Layout("encoder.layer", "attention.self", "attention_head_size", ("num_attention_heads",),
                         ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj",
                          "attention.self.pos_key_proj", "attention.self.pos_query_proj"),
                         "attention.output.dense", "intermediate.dense", "output.dense"),
    "modernbert": Layout("layers", "attn", "head_dim", (), ("attn.Wqkv",), "attn.Wo", "mlp.Wi", "mlp.Wo",
                         fused_qkv=True, gated_ffn=True, all_head_size=None),
    # The rotary encoders written the Llama way (heads are inferred from the projections' widths).
    "nomic_bert": _ROTARY_GATED, "gte": _ROTARY_GATED,
    "jina_embeddings_v3": Layout("layers", "self_attn", "head_dim", (), _LLAMA_QKV, "self_attn.o_proj", "mlp.fc1",
                                 "mlp.fc2", all_head_size=None),
}


@dataclass(frozen=True)
class Shape:
    """What a pruned model keeps: original head indices and FFN width, per layer."""

    heads: tuple[tuple[int, ...], ...]
    ffn: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"heads": [list(h) for h in self.heads], "ffn": list(self.ffn)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Shape:
        return cls(tuple(tuple(int(i) for i in h) for h in data["heads"]), tuple(int(n) for n in data["ffn"]))


def layout(model: Any) -> Layout:
    model_type = str(model.config.model_type)
    if model_type not in LAYOUTS:
        raise UsageError(f"kiln prune does not know where {model_type!r} keeps its heads and neurons; it prunes "
                         f"{', '.join(sorted(LAYOUTS))}")
    return LAYOUTS[model_type]


def module_at(module: Any, path: str) -> Any:
    """The submodule at a dotted ``path`` (None where it is absent, e.g. DeBERTa's optional projections)."""
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def layers(model: Any) -> list[Any]:
    return list(module_at(model.base_model, layout(model).layers))


def head_dim(model: Any, layer: Any) -> int:
    return int(getattr(module_at(layer, layout(model).attention), layout(model).head_dim))


def heads_of(model: Any, layer: Any) -> int:
    return module_at(layer, layout(model).attention_out).in_features // head_dim(model, layer)


def ffn_of(model: Any, layer: Any) -> int:
    return module_at(layer, layout(model).ffn_out).in_features


def current_shape(model: Any) -> Shape:
    """The shape as it is now (all heads, when nothing was pruned)."""
    stored = getattr(model.config, CONFIG_KEY, None)
    if stored:
        return Shape.from_json(stored)
    return Shape(tuple(tuple(range(heads_of(model, layer))) for layer in layers(model)),
                 tuple(ffn_of(model, layer) for layer in layers(model)))


def _cut_linear(linear: Any, index: Any, dim: int) -> None:
    """Keep ``index`` along the weight's ``dim`` (0: output rows, with the bias; 1: input columns), in place."""
    import torch

    weight = linear.weight.detach().index_select(dim, index).clone()
    linear.weight = torch.nn.Parameter(weight)
    if dim == 0:
        if linear.bias is not None:
            linear.bias = torch.nn.Parameter(linear.bias.detach().index_select(0, index).clone())
        linear.out_features = weight.shape[0]
    else:
        linear.in_features = weight.shape[1]


def cut_heads(model: Any, layer: Any, keep: Sequence[int]) -> None:
    """Keep the heads at positions ``keep`` (of the layer's current heads)."""
    import torch

    lay, dim = layout(model), head_dim(model, layer)
    count = heads_of(model, layer)
    rows = torch.tensor([h * dim + i for h in keep for i in range(dim)], dtype=torch.long)
    for path in lay.projections:
        linear = module_at(layer, path)
        if linear is None:
            continue
        if lay.fused_qkv:  # [q | k | v]: the same heads in each third
            width = count * dim
            _cut_linear(linear, torch.cat([rows + part * width for part in range(3)]), 0)
        else:
            _cut_linear(linear, rows, 0)
    _cut_linear(module_at(layer, lay.attention_out), rows, 1)
    attention = module_at(layer, lay.attention)
    for name in lay.head_count:
        setattr(attention, name, len(keep))
    if lay.all_head_size:
        setattr(attention, lay.all_head_size, len(keep) * dim)
    if lay.position_bias:
        _slice_position_bias(attention, keep)


def cut_ffn(model: Any, layer: Any, keep: Sequence[int]) -> None:
    """Keep the FFN neurons at positions ``keep``."""
    import torch

    lay = layout(model)
    index = torch.tensor(list(keep), dtype=torch.long)
    width = ffn_of(model, layer)
    _cut_linear(module_at(layer, lay.ffn_in), torch.cat([index, index + width]) if lay.gated_ffn else index, 0)
    if lay.ffn_gate is not None:
        _cut_linear(module_at(layer, lay.ffn_gate), index, 0)
    _cut_linear(module_at(layer, lay.ffn_out), index, 1)


def _slice_position_bias(attention: Any, keep: Sequence[int]) -> None:
    """MPNet computes one relative-position bias with a slice per original head and hands it to every layer:
    a pruned layer takes the slices of the heads it kept (a pre-hook, so export traces it too)."""
    import torch

    for handle in getattr(attention, "_kiln_bias_hooks", ()):  # cutting twice composes: original indices
        handle.remove()
    original = getattr(attention, "_kiln_heads", None)
    heads = [original[i] for i in keep] if original is not None else list(keep)
    attention._kiln_heads = heads
    index = torch.tensor(heads, dtype=torch.long)

    def hook(module, args, kwargs):
        if len(args) > 2 and args[2] is not None:
            args = (*args[:2], args[2].index_select(1, index), *args[3:])
        elif kwargs.get("position_bias") is not None:
            kwargs = {**kwargs, "position_bias": kwargs["position_bias"].index_select(1, index)}
        return args, kwargs

    attention._kiln_bias_hooks = (attention.register_forward_pre_hook(hook, with_kwargs=True),)


def apply_shape(model: Any, shape: Shape) -> None:
    """Cut a full-size model to ``shape`` (used when loading: the weights are loaded after)."""
    model_layers = layers(model)
    if len(shape.heads) != len(model_layers) or len(shape.ffn) != len(model_layers):
        raise ModelLoadError(f"{CONFIG_KEY} in config.json describes {len(shape.heads)} layers; the model has "
                             f"{len(model_layers)}")
    for layer, heads, width in zip(model_layers, shape.heads, shape.ffn, strict=True):
        if len(heads) != heads_of(model, layer):
            cut_heads(model, layer, heads)
        if width != ffn_of(model, layer):
            cut_ffn(model, layer, range(width))


def record(model: Any, shape: Shape) -> None:
    """Write ``shape`` into the model's config so that save_pretrained carries it (see the module doc)."""
    full_heads = int(model.config.num_attention_heads)  # DistilBERT's n_heads answers to this name too
    if all(len(h) == full_heads for h in shape.heads) and len(set(shape.ffn)) == 1:
        # expressible: a plain transformers config (DistilBERT calls the FFN width hidden_dim)
        name = "hidden_dim" if hasattr(model.config, "hidden_dim") else "intermediate_size"
        setattr(model.config, name, shape.ffn[0])
        if hasattr(model.config, CONFIG_KEY):
            delattr(model.config, CONFIG_KEY)
        return
    setattr(model.config, CONFIG_KEY, shape.to_json())


def save_model(model: Any, directory: Path) -> None:
    """``model.save_pretrained`` as safetensors; a model whose shape only kiln can build (``kiln_pruning`` in its
    config) keeps its modules' own weight names. transformers 5 renames some families' weights back to their hub
    checkpoints' layout on save (GTE's q/k/v become one fused ``qkv_proj`` under ``encoder.layer``) and converts
    them again on load; :func:`load_pruned` builds the modules itself and reads the weights by those names."""
    pruned = getattr(model.config, CONFIG_KEY, None) is not None
    model.save_pretrained(directory, safe_serialization=True, save_original_format=not pruned)


def load_pruned(directory: Path, auto_class: str, **kwargs: Any) -> Any:
    """A model saved by ``kiln prune`` with a ``kiln_pruning`` shape: built full-size from its config, cut to
    the shape, then given its weights (strictly: every weight present, none left over)."""
    import transformers
    from safetensors.torch import load_file

    config = transformers.AutoConfig.from_pretrained(directory)
    model = getattr(transformers, auto_class).from_config(config, **kwargs)
    apply_shape(model, Shape.from_json(getattr(config, CONFIG_KEY)))
    state: dict[str, Any] = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        state.update(load_file(file))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ModelLoadError(f"{directory}: the pruned weights do not fit the shape in config.json (missing "
                             f"{missing[:4]}, unexpected {list(unexpected)[:4]})")
    return model.eval()
