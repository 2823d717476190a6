"""A decoder's step graph written from its weights, with ONNX Runtime's fused attention and a cache updated in place.

The exported step graph (``kiln.decoder.graph``) concatenates each layer's past keys and values with the new ones
every step: on GPT-2 small at batch 4 after a 512-token prompt, that copy of 24 tensors of ~6.4 MB was 25% of a
step (ONNX Runtime's profiler, benchmarks/RESULTS.md). Here each layer's attention is one ``GroupQueryAttention``
(com.microsoft; GPT-2's multi-head attention is the case kv_num_heads == num_heads), whose past and present may be
one buffer: bound to the same memory as input and output, the kernel writes only the new tokens' keys and values
(``kiln.decoder.steps.BufferSteps`` does the binding). The buffer holds each row's tokens from position 0 with no
padding (the op's layout), so the graph takes each row's length (``seqlens_k``: total - 1) and the batch's longest
(``total_sequence_length``) instead of an attention mask.

The graph is written node by node from the PyTorch weights, per architecture (``BUILDERS``): the whole of GPT-2,
GPT-Neo or a Llama-family model is a few dozen lines of ONNX, and this avoids tracing transformers' attention, whose
shape arithmetic was ~570 nodes a step in the export. Llama-family blocks (Llama, Qwen3, Gemma 3) rotate queries and
keys inside the attention op (``do_rotary``, from cos/sin tables kiln computes with the model's own rotary module, so
Llama 3's frequency scaling is whatever transformers computes) and read grouped-query attention's key/value heads
as they are. Each build is checked like any variant: against the original on held-out text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.decoder.graph import INPUT_IDS, LOGITS, LOGITS_AT, POSITION_IDS, SEQLENS_K, TOTAL_LENGTH, CacheShape
from kiln.exporting.onnx import EXTERNAL_DATA_SUFFIX

OPSET = 17
MS_DOMAIN = "com.microsoft"
# transformers' activation names -> (op, domain) over x + bias; FastGelu is gelu_new's tanh formula exactly.
COS, SIN = "rotary.cos", "rotary.sin"  # the rotary tables, weights of the graph
ACTIVATIONS: dict[str, tuple[str, str]] = {
    "gelu_new": ("FastGelu", MS_DOMAIN), "gelu_pytorch_tanh": ("FastGelu", MS_DOMAIN),
    "gelu_fast": ("FastGelu", MS_DOMAIN), "gelu": ("BiasGelu", MS_DOMAIN),
}


@dataclass(frozen=True)
class WeightFormat:
    """How the graph stores its projection weights: fp32 MatMuls, or (``bits`` 4) ONNX Runtime's ``MatMulNBits``:
    4-bit symmetric blocks of ``block_size`` input rows with an fp32 scale each, activations in fp32. ``keep``: the
    MatMul nodes (by name, as a sensitivity ranking names them) left in fp32."""

    bits: int = 32
    block_size: int = 32
    keep: frozenset[str] = frozenset()
    accuracy_level: int = 0  # MatMulNBits' compute type: 0 fp32 activations, 4 int8 (quantized per block)

    def recipe(self) -> dict[str, Any]:
        return {"pass": "int4-weights", "op": "MatMulNBits", "block_size": self.block_size, "symmetric": True,
                "accuracy_level": self.accuracy_level, "kept_fp32": sorted(self.keep)}


@dataclass(frozen=True)
class _Norm:
    """An RMSNorm's scale and epsilon. Gemma's norms scale by 1 + weight (their weights are zero-centred): the
    offset is added here once, so the graph's op is Llama's."""

    weight: np.ndarray
    eps: float

    @classmethod
    def of(cls, module: Any, offset: float = 0.0) -> _Norm:
        eps = module.variance_epsilon if hasattr(module, "variance_epsilon") else module.eps
        return cls(_np(module.weight) + np.float32(offset), float(eps))


@dataclass
class _Graph:
    """Nodes as they are added, and weights written to the side file as they come (the graph keeps only where each
    one is): GPT-2 small's build peaked at 4.7 GB holding them in the protobuf and serializing it, and a 2.7B
    model's weights would pass protobuf's 2 GB limit."""

    path: Path  # the graph's file; its weights go to this name + EXTERNAL_DATA_SUFFIX
    format: WeightFormat = WeightFormat()
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    _data: Any = None

    def weight(self, name: str, array: np.ndarray) -> str:
        from onnx import TensorProto, helper

        array = np.ascontiguousarray(array)
        if self._data is None:
            self._data = open(self.side_file, "wb")
        offset = self._data.tell()
        self._data.write(array.data)
        self._data.write(b"\0" * (-array.nbytes % 4096))  # page-aligned, as in kiln.exporting.onnx
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        for key, value in (("location", self.side_file.name), ("offset", str(offset)),
                           ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.data_location = TensorProto.EXTERNAL
        self.initializers.append(tensor)
        return name

    def constant(self, name: str, array: np.ndarray) -> str:
        """A small tensor kept in the graph: ONNX Runtime's shape inference reads shape arguments only there."""
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    @property
    def side_file(self) -> Path:
        return self.path.parent / (self.path.name + EXTERNAL_DATA_SUFFIX)

    def node(self, op: str, inputs: list[str], output: str | list[str], domain: str = "", **attributes) -> Any:
        from onnx import helper

        outputs = [output] if isinstance(output, str) else output
        # Named after its first output: the int8 passes rank, keep and report layers by node name (unnamed, every
        # node was "" and keeping one layer in fp32 kept them all).
        self.nodes.append(helper.make_node(op, inputs, outputs, name=outputs[0], domain=domain, **attributes))
        return output

    def linear(self, x: str, name: str, weight: np.ndarray, bias: np.ndarray | None) -> str:
        """x @ weight (+ bias); ``weight`` is [in, out]."""
        y = self.matmul(x, f"{name}.weight", weight, f"{name}.matmul")
        return y if bias is None else self.node("Add", [y, self.weight(f"{name}.bias", bias)], f"{name}.out")

    def matmul(self, x: str, weight_name: str, weight: np.ndarray, output: str) -> str:
        """x @ weight [in, out], in the graph's weight format (a layer ``keep`` names, or whose input size is not a
        whole number of blocks, stays fp32)."""
        fmt = self.format
        if fmt.bits == 32 or output in fmt.keep or weight.shape[0] % fmt.block_size:
            return self.node("MatMul", [x, self.weight(weight_name, weight)], output)
        from onnxruntime.capi._pybind_state import quantize_matmul_4bits

        k, n = weight.shape
        blocks = k // fmt.block_size
        packed = np.zeros((n, blocks, fmt.block_size // 2), np.uint8)
        scales = np.zeros((n, blocks), np.float32)
        zero_points = np.zeros((n, (blocks + 1) // 2), np.uint8)  # unused: symmetric
        quantize_matmul_4bits(packed, np.ascontiguousarray(weight, np.float32), scales, zero_points,
                              fmt.block_size, n, k, True)
        return self.node("MatMulNBits", [x, self.weight(f"{weight_name}.q4", packed),
                                         self.weight(f"{weight_name}.scales", scales.reshape(-1))],
                         output, domain=MS_DOMAIN, K=k, N=n, bits=4, block_size=fmt.block_size,
                         accuracy_level=fmt.accuracy_level)

    def layer_norm(self, x: str, name: str, module: Any) -> str:
        return self.node("LayerNormalization", [x, self.weight(f"{name}.weight", _np(module.weight)),
                                                self.weight(f"{name}.bias", _np(module.bias))],
                         f"{name}.out", axis=-1, epsilon=float(module.eps))

    def rms_norm(self, x: str, name: str, norm: _Norm) -> str:
        """RMSNorm (ONNX Runtime's SimplifiedLayerNormalization: x / rms(x) * weight) over the last axis."""
        return self.node("SimplifiedLayerNormalization", [x, self.weight(f"{name}.weight", norm.weight)],
                         f"{name}.out", axis=-1, epsilon=norm.eps)

    def close(self) -> None:
        if self._data is not None:
            self._data.close()


@dataclass(frozen=True)
class _Cache:
    """One layer's cache names and the attention op's head counts."""

    past: tuple[str, str]
    present: tuple[str, str]
    heads: int  # query heads
    kv_heads: int


@dataclass(frozen=True)
class _Layer:
    """A GPT-2-style block: q, k, v packed as one [in, 3 x hidden] projection, LayerNorm, a biased activation."""

    ln_1: Any
    qkv_weight: np.ndarray
    qkv_bias: np.ndarray | None
    out_weight: np.ndarray
    out_bias: np.ndarray | None
    ln_2: Any
    fc_weight: np.ndarray
    fc_bias: np.ndarray
    proj_weight: np.ndarray
    proj_bias: np.ndarray
    scale: float  # attention's scale (GroupQueryAttention's ``scale``)
    window: int  # keys a query sees, its own included; -1: all (GroupQueryAttention's ``local_window_size``)
    activation: str

    def write(self, graph: _Graph, x: str, p: str, cache: _Cache) -> str:
        h = graph.layer_norm(x, f"{p}.ln_1", self.ln_1)
        qkv = graph.linear(h, f"{p}.attn.qkv", self.qkv_weight, self.qkv_bias)
        attended = graph.node("GroupQueryAttention", [qkv, "", "", *cache.past, SEQLENS_K, TOTAL_LENGTH],
                              [f"{p}.attn.context", *cache.present], domain=MS_DOMAIN, num_heads=cache.heads,
                              kv_num_heads=cache.kv_heads, scale=self.scale, local_window_size=self.window)[0]
        x = graph.node("Add", [x, graph.linear(attended, f"{p}.attn.out", self.out_weight, self.out_bias)],
                       f"{p}.residual_1")
        h = graph.layer_norm(x, f"{p}.ln_2", self.ln_2)
        op, domain = ACTIVATIONS[self.activation]
        h = graph.node(op, [graph.matmul(h, f"{p}.mlp.fc.weight", self.fc_weight, f"{p}.mlp.fc"),
                            graph.weight(f"{p}.mlp.fc.bias", self.fc_bias)], f"{p}.mlp.act", domain=domain)
        return graph.node("Add", [x, graph.linear(h, f"{p}.mlp.proj", self.proj_weight, self.proj_bias)],
                          f"{p}.residual_2")


@dataclass(frozen=True)
class _LlamaLayer:
    """A Llama-family block: RMSNorm, q/k/v packed as one projection, (Qwen3, Gemma 3) RMSNorm of each query and key
    head, rotary positions inside the attention op, a gated feed-forward (SwiGLU; Gemma's GeGLU) with its gate and
    up projections packed. Gemma 3 adds a norm after attention and after the feed-forward (each before its residual
    add), and its sliding layers attend to a window and rotate with their own tables."""

    input_norm: _Norm
    qkv_weight: np.ndarray  # [in, (heads + 2 x kv_heads) x head_size]
    qkv_bias: np.ndarray | None  # Qwen2's
    q_norm: _Norm | None  # Qwen3's and Gemma 3's per-head RMSNorm, or None
    k_norm: _Norm | None
    out_weight: np.ndarray
    post_norm: _Norm  # before the feed-forward (Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm)
    gate_up_weight: np.ndarray  # [in, 2 x intermediate]: the gate's columns, then the up projection's
    down_weight: np.ndarray
    scale: float
    head_size: int
    activation: str = "silu"  # the gate's: silu, or gelu_pytorch_tanh (Gemma's)
    attn_out_norm: _Norm | None = None  # Gemma's post_attention_layernorm
    mlp_out_norm: _Norm | None = None  # Gemma's post_feedforward_layernorm
    window: int = -1  # keys a query sees, its own included (GroupQueryAttention's local_window_size); -1: all
    rotary: tuple[str, str] = (COS, SIN)  # the cos/sin tables this layer rotates with

    def write(self, graph: _Graph, x: str, p: str, cache: _Cache) -> str:
        h = graph.rms_norm(x, f"{p}.input_norm", self.input_norm)
        qkv = graph.linear(h, f"{p}.attn.qkv", self.qkv_weight, self.qkv_bias)
        if self.q_norm is None or self.k_norm is None:
            q, k, v = qkv, "", ""  # packed: the op splits it
        else:  # normalised per head before the rotation, as transformers' Qwen3 and Gemma 3 attention do
            sizes = [cache.heads * self.head_size, cache.kv_heads * self.head_size, cache.kv_heads * self.head_size]
            q, k, v = graph.node("Split", [qkv, graph.constant(f"{p}.attn.split", np.array(sizes, np.int64))],
                                 [f"{p}.attn.q", f"{p}.attn.k", f"{p}.attn.v"], axis=-1)
            q = self._per_head_norm(graph, q, f"{p}.attn.q_norm", self.q_norm, cache.heads)
            k = self._per_head_norm(graph, k, f"{p}.attn.k_norm", self.k_norm, cache.kv_heads)
        attended = graph.node("GroupQueryAttention", [q, k, v, *cache.past, SEQLENS_K, TOTAL_LENGTH, *self.rotary,
                                                      POSITION_IDS],
                              [f"{p}.attn.context", *cache.present], domain=MS_DOMAIN, num_heads=cache.heads,
                              kv_num_heads=cache.kv_heads, scale=self.scale, do_rotary=1, rotary_interleaved=0,
                              local_window_size=self.window)[0]
        h = graph.linear(attended, f"{p}.attn.out", self.out_weight, None)
        if self.attn_out_norm is not None:
            h = graph.rms_norm(h, f"{p}.attn_out_norm", self.attn_out_norm)
        x = graph.node("Add", [x, h], f"{p}.residual_1")
        h = graph.rms_norm(x, f"{p}.post_norm", self.post_norm)
        gate_up = graph.linear(h, f"{p}.mlp.gate_up", self.gate_up_weight, None)
        width = self.down_weight.shape[0]
        gate, up = graph.node("Split", [gate_up, graph.constant(f"{p}.mlp.split", np.array([width, width], np.int64))],
                              [f"{p}.mlp.gate", f"{p}.mlp.up"], axis=-1)
        if self.activation == "silu":
            gated = graph.node("Mul", [gate, graph.node("Sigmoid", [gate], f"{p}.mlp.sigmoid")], f"{p}.mlp.silu")
        else:  # gelu_pytorch_tanh: FastGelu is its tanh formula
            gated = graph.node("FastGelu", [gate], f"{p}.mlp.gelu", domain=MS_DOMAIN)
        h = graph.linear(graph.node("Mul", [gated, up], f"{p}.mlp.act"), f"{p}.mlp.down", self.down_weight, None)
        if self.mlp_out_norm is not None:
            h = graph.rms_norm(h, f"{p}.mlp_out_norm", self.mlp_out_norm)
        return graph.node("Add", [x, h], f"{p}.residual_2")

    def _per_head_norm(self, graph: _Graph, x: str, name: str, norm: _Norm, heads: int) -> str:
        split = graph.constant(f"{name}.head_shape", np.array([0, 0, heads, self.head_size], np.int64))
        normed = graph.rms_norm(graph.node("Reshape", [x, split], f"{name}.in"), name, norm)
        flat = graph.constant(f"{name}.flat_shape", np.array([0, 0, heads * self.head_size], np.int64))
        return graph.node("Reshape", [normed, flat], f"{name}.flat")


@dataclass(frozen=True)
class _Decoder:
    embed: Callable[[_Graph], str]  # writes the input embedding (tokens, and positions where learned)
    layers: Iterator[Any]  # made one at a time as the graph is written: a layer's copied weights are dropped
    final_norm: Callable[[_Graph, str], str]
    lm_head: np.ndarray  # [vocab, hidden]
    heads: int  # query heads
    rotary: dict[str, np.ndarray] = field(default_factory=dict)  # cos and sin tables [positions, head_size / 2]
    logit_softcap: float | None = None  # Gemma's final_logit_softcapping: logits = cap * tanh(logits / cap)


def _np(tensor: Any) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _gpt2(model: Any) -> _Decoder:
    config, body = model.config, model.transformer

    def layers() -> Iterator[_Layer]:
        for index, block in enumerate(body.h):
            attention, mlp = block.attn, block.mlp
            scale = 1.0 / float(config.n_embd // config.n_head) ** 0.5 if config.scale_attn_weights else 1.0
            if config.scale_attn_by_inverse_layer_idx:
                scale /= float(index + 1)
            # transformers' Conv1D keeps weights as [in, out]: MatMul takes them as they are.
            yield _Layer(block.ln_1, _np(attention.c_attn.weight), _np(attention.c_attn.bias),
                         _np(attention.c_proj.weight), _np(attention.c_proj.bias), block.ln_2,
                         _np(mlp.c_fc.weight), _np(mlp.c_fc.bias), _np(mlp.c_proj.weight), _np(mlp.c_proj.bias),
                         scale, -1, config.activation_function)
    return _gpt_decoder(model, layers())


def _gpt_neo(model: Any) -> _Decoder:
    config, body = model.config, model.transformer

    def layers() -> Iterator[_Layer]:
        for kind, block in zip(config.attention_layers, body.h):
            attention, mlp = block.attn.attention, block.mlp
            # nn.Linear keeps [out, in]; GPT-Neo's q, k and v have no bias and its attention is not scaled.
            qkv = np.concatenate([_np(attention.q_proj.weight), _np(attention.k_proj.weight),
                                  _np(attention.v_proj.weight)]).T
            # A local layer's query sees the last window_size positions, itself included (transformers' mask).
            # ONNX Runtime 1.32's op keeps local_window_size keys the same way: window_size - 1 was off from the
            # 8th token on (tests/integration/test_generation.py holds every position to transformers'; the gate
            # rejected it).
            window = int(config.window_size) if kind == "local" else -1
            yield _Layer(block.ln_1, qkv, None, _np(attention.out_proj.weight).T, _np(attention.out_proj.bias),
                         block.ln_2, _np(mlp.c_fc.weight).T, _np(mlp.c_fc.bias), _np(mlp.c_proj.weight).T,
                         _np(mlp.c_proj.bias), 1.0, window, config.activation_function)
    return _gpt_decoder(model, layers())


def _gpt_decoder(model: Any, layers: Iterator[_Layer]) -> _Decoder:
    """GPT-2 and GPT-Neo: learned token and position tables, LayerNorm last."""
    body = model.transformer

    def embed(graph: _Graph) -> str:
        tokens = graph.node("Gather", [graph.weight("wte", _np(body.wte.weight)), INPUT_IDS], "tokens")
        where = graph.node("Gather", [graph.weight("wpe", _np(body.wpe.weight)), POSITION_IDS], "positions")
        return graph.node("Add", [tokens, where], "embedded")

    return _Decoder(embed, layers, lambda graph, x: graph.layer_norm(x, "ln_f", body.ln_f),
                    _np(model.get_output_embeddings().weight), int(model.config.num_attention_heads))


def _llama(model: Any) -> _Decoder:
    """Llama and Qwen3 (Qwen2's q/k/v biases too): the blocks' weights, and rotary tables over every position."""
    config, body = model.config, model.model
    shape = CacheShape.of(config)

    def layers() -> Iterator[_LlamaLayer]:
        for block in body.layers:
            attention, mlp = block.self_attn, block.mlp
            q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
            yield _LlamaLayer(_Norm.of(block.input_layernorm), *_qkv(attention),
                              _Norm.of(q_norm) if q_norm is not None else None,
                              _Norm.of(k_norm) if k_norm is not None else None, _np(attention.o_proj.weight).T,
                              _Norm.of(block.post_attention_layernorm), *_gate_up_down(mlp),
                              float(attention.scaling), shape.head_size)

    def embed(graph: _Graph) -> str:
        table = graph.weight("embed_tokens", _np(body.embed_tokens.weight))
        return graph.node("Gather", [table, INPUT_IDS], "embedded")

    cos, sin = _rotary_tables(body.rotary_emb, config, shape)
    return _Decoder(embed, layers(), lambda graph, x: graph.rms_norm(x, "norm", _Norm.of(body.norm)),
                    _np(model.get_output_embeddings().weight), int(config.num_attention_heads), {COS: cos, SIN: sin})


def _gemma3(model: Any) -> _Decoder:
    """The Gemma-3 language models: embeddings scaled by sqrt(hidden), norms of 1 + weight (four a block), GeGLU,
    sliding layers with a window and their own rotary base, and the logits soft-capped where the config says."""
    config, body = model.config, model.model
    shape = CacheShape.of(config)
    tables = {kind: _rotary_tables(body.rotary_emb, config, shape, kind) for kind in sorted(set(config.layer_types))}
    names = {kind: (f"{COS}.{kind}", f"{SIN}.{kind}") for kind in tables}

    def layers() -> Iterator[_LlamaLayer]:
        for kind, block in zip(config.layer_types, body.layers):
            attention, mlp = block.self_attn, block.mlp
            yield _LlamaLayer(_Norm.of(block.input_layernorm, 1.0), *_qkv(attention),
                              _Norm.of(attention.q_norm, 1.0), _Norm.of(attention.k_norm, 1.0),
                              _np(attention.o_proj.weight).T, _Norm.of(block.pre_feedforward_layernorm, 1.0),
                              *_gate_up_down(mlp), float(attention.scaling), shape.head_size,
                              activation=config.hidden_activation,
                              attn_out_norm=_Norm.of(block.post_attention_layernorm, 1.0),
                              mlp_out_norm=_Norm.of(block.post_feedforward_layernorm, 1.0),
                              # a query sees the last sliding_window slots, its own included (transformers' mask)
                              window=int(config.sliding_window) if kind == "sliding_attention" else -1,
                              rotary=names[kind])

    def embed(graph: _Graph) -> str:
        tokens = graph.node("Gather", [graph.weight("embed_tokens", _np(body.embed_tokens.weight)), INPUT_IDS],
                            "tokens")
        scale = graph.constant("embed_scale", np.array(float(body.embed_tokens.scalar_embed_scale), np.float32))
        return graph.node("Mul", [tokens, scale], "embedded")

    rotary = {name: table for kind, pair in names.items() for name, table in zip(pair, tables[kind])}
    return _Decoder(embed, layers(), lambda graph, x: graph.rms_norm(x, "norm", _Norm.of(body.norm, 1.0)),
                    _np(model.get_output_embeddings().weight), int(config.num_attention_heads), rotary,
                    config.final_logit_softcapping)


def _qkv(attention: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """q, k and v packed as one [in, out] projection (nn.Linear keeps [out, in]), and their biases where set."""
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    qkv = np.concatenate([_np(m.weight) for m in projections]).T
    bias = np.concatenate([_np(m.bias) for m in projections]) if attention.q_proj.bias is not None else None
    return qkv, bias


def _gate_up_down(mlp: Any) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([_np(mlp.gate_proj.weight), _np(mlp.up_proj.weight)]).T, _np(mlp.down_proj.weight).T


def _rotary_tables(rotary: Any, config: Any, shape: CacheShape, *kind: str) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin over every position from the model's own rotary module (its scaling rules, e.g. Llama 3's, and
    attention_scaling applied; ``kind``: Gemma 3's layer type). Each repeats its first half (rotate_half's
    layout); the op's tables hold that half."""
    import torch

    with torch.no_grad():
        where = torch.arange(int(config.max_position_embeddings))[None]
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), where, *kind)
    half = shape.head_size // 2
    return _np(cos[0, :, :half]), _np(sin[0, :, :half])


LLAMA_FAMILY = ("llama", "qwen3", "gemma3_text")  # rotary inside the attention op
# transformers model_type -> its embedding, blocks and head, each able to write itself into the graph.
BUILDERS: dict[str, Callable[[Any], _Decoder]] = {"gpt2": _gpt2, "gpt_neo": _gpt_neo, "llama": _llama,
                                                   "qwen3": _llama, "gemma3_text": _gemma3}


def why_not(config: Any) -> str | None:
    """Why a model of this transformers ``config`` has no fused step graph, or None."""
    kind = config.model_type
    if kind not in BUILDERS:
        return f"kiln writes fused step graphs for {', '.join(sorted(BUILDERS))}, not {kind}"
    if kind == "gemma3_text":
        if getattr(config, "use_bidirectional_attention", False):
            return "a bidirectional Gemma 3 (EmbeddingGemma) is an encoder, not a generator"
        if config.hidden_activation != "gelu_pytorch_tanh":
            return f"activation {config.hidden_activation!r}: kiln's Gemma 3 graph computes GeGLU with tanh's gelu"
        if config.attn_logit_softcapping is not None:
            return "attention logit soft-capping is not written into kiln's fused graph"
    elif kind in LLAMA_FAMILY:
        if config.hidden_act != "silu":
            return f"activation {config.hidden_act!r}: kiln's Llama-family graph computes SwiGLU with silu"
    else:
        activation = getattr(config, "activation_function", None)
        if activation not in ACTIVATIONS:
            return f"activation {activation!r} is not one of {', '.join(sorted(ACTIVATIONS))}"
    if CacheShape.of(config).head_size % 8:
        return "GroupQueryAttention needs a head size that is a multiple of 8"
    if kind in LLAMA_FAMILY and CacheShape.of(config).head_size % 16:
        return "GroupQueryAttention rotates queries and keys only for head sizes that are multiples of 16"
    return None


def fused_recipe(files: list[Path]) -> list[dict]:
    """The recipe record of a fused step graph (kiln export --format onnx-fused, kiln optimize's onnx-fused)."""
    return [{"pass": "fused-decoder", "attention": "GroupQueryAttention", "cache": "one buffer, updated in place",
             "external_data": len(files) > 1}]


def build_fused_decoder(model: Any, path: Path, weights: WeightFormat = WeightFormat()) -> list[Path]:
    """Write ``model``'s fused step graph to ``path`` and its weights to ``path``.data (in ``weights``' format);
    returns both files."""
    import onnx
    from onnx import TensorProto, helper

    reason = why_not(model.config)
    if reason:
        raise ValueError(reason)
    shape = CacheShape.of(model.config)
    decoder = BUILDERS[model.config.model_type](model)
    path.parent.mkdir(parents=True, exist_ok=True)
    graph = _Graph(path, weights)
    try:
        x = decoder.embed(graph)
        for name, table in decoder.rotary.items():
            graph.weight(name, table)
        cache_dims = ["batch", shape.heads, "max_sequence", shape.head_size]
        cache_inputs, cache_outputs = [], []
        for i, (layer, past, present) in enumerate(zip(decoder.layers, _pairs(shape.past_names()),
                                                       _pairs(shape.present_names()))):
            x = layer.write(graph, x, f"layers.{i}", _Cache(past, present, decoder.heads, shape.heads))
            cache_inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, cache_dims) for n in past]
            cache_outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, cache_dims) for n in present]
        h = decoder.final_norm(graph, x)
        # Only the positions asked for reach the head: a generation's prefill needs each row's last.
        at = graph.node("Unsqueeze", [LOGITS_AT, graph.constant("axis_2", np.array([2], np.int64))], "logits_at")
        h = graph.node("GatherND", [h, at], "logits_hidden", batch_dims=1)
        # A MatMul over [hidden, vocab], as the export has it: the int8 passes quantize it as one more layer.
        if decoder.logit_softcap is None:
            graph.matmul(h, "lm_head.weight", decoder.lm_head.T, LOGITS)
        else:
            cap = graph.constant("logit_softcap", np.array(decoder.logit_softcap, np.float32))
            logits = graph.matmul(h, "lm_head.weight", decoder.lm_head.T, "logits.raw")
            capped = graph.node("Tanh", [graph.node("Div", [logits, cap], "logits.scaled")], "logits.tanh")
            graph.node("Mul", [capped, cap], LOGITS)
        inputs = [helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["batch", "sequence"]),
                  helper.make_tensor_value_info(POSITION_IDS, TensorProto.INT64, ["batch", "sequence"]),
                  helper.make_tensor_value_info(SEQLENS_K, TensorProto.INT32, ["batch"]),
                  helper.make_tensor_value_info(TOTAL_LENGTH, TensorProto.INT32, []),
                  helper.make_tensor_value_info(LOGITS_AT, TensorProto.INT64, ["batch", "wanted"]), *cache_inputs]
        vocab = decoder.lm_head.shape[0]
        outputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["batch", "wanted", vocab]),
                   *cache_outputs]
    finally:
        graph.close()
    model_proto = helper.make_model(helper.make_graph(graph.nodes, "kiln-fused-decoder", inputs, outputs,
                                                      graph.initializers),
                                    opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)])
    onnx.save_model(model_proto, str(path))
    return [path, graph.side_file]


def _pairs(names: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(names[i], names[i + 1]) for i in range(0, len(names), 2)]
