"""HF checkpoint (the factory's seeded one, tools/probe/checkpoints.py) -> GGUF for llama.cpp, cached.

Written with the `gguf` package the way llama.cpp's own convert_hf_to_gguf.py writes these archs:

- llama (and mistral, as llama): q/k projection rows permuted per head (HF rotates halves, llama.cpp's llama arch rotates
  adjacent pairs; PERMUTED_ROPE), so a tap of q/k read from llama.cpp is un-permuted (taps.py);
- qwen2: NEOX rotation, weights as they are (q/k/v biases included);
- 1-D tensors (norms, biases) stay F32; 2-D ones take the GGUF type (F32, F16 or a quant type);
- tokenizer: the checkpoint's byte-level BPE as `gpt2` with the `gpt-2` pre-tokenizer, its merges
  and special ids (gguf.SpecialVocab), no BOS added (the factory's tokenizer adds none).

Quant types (QUANT_TYPES) quantize every 2-D weight whose rows split into whole blocks; the
reference then loads the *dequantized twin*: a copy of the HF checkpoint whose tensors went
through the same gguf.quants quantize -> dequantize round trip, fp32 (tools/probe/quant.py's
contract for tinyserve). gguf 0.19 cannot quantize K-quants (Q4_K ...), so the 4/5-bit types are
Q4_0, Q4_1, Q5_0, Q5_1.

Cache: <cache_root>/gguf/<checkpoint content hash>-<type>/{model.gguf, reference/}.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

FLOAT_TYPES = {"float32": "f32", "float16": "f16"}  # scenario dtype -> GGUF float type
QUANT_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
GGUF_TYPES = ("f32", "f16", *QUANT_TYPES)
# HF model_type -> gguf.MODEL_ARCH member; mistral is converted to llama, as convert_hf_to_gguf does
ARCHS = {"llama": "LLAMA", "mistral": "LLAMA", "qwen2": "QWEN2"}
PERMUTED_ROPE = ("llama", "mistral")  # archs whose q/k rows llama.cpp wants pair-interleaved per head
# archs whose llama.cpp graph has no sliding window: a sequence longer than the HF window is refused
NO_SLIDING_WINDOW = ("mistral",)
GGUF_FILE = "model.gguf"
TWIN_DIR = "reference"


def content_hash(checkpoint: Path) -> str:
    """sha256 over the checkpoint's files (names and bytes): the cache key of its conversions."""
    h = hashlib.sha256()
    for f in sorted(p for p in checkpoint.iterdir() if p.is_file() and not p.name.startswith(".")):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def converted_dir(checkpoint: Path, gguf_type: str) -> Path:
    from tools.probe.checkpoints import cache_root

    return cache_root() / "gguf" / f"{content_hash(checkpoint)}-{gguf_type}"


def ensure_gguf(checkpoint: str | Path, gguf_type: str) -> Path:
    """The checkpoint as a GGUF file of `gguf_type`, written once (and, for a quant type, its
    dequantized twin beside it, see twin_checkpoint)."""
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"unknown GGUF type {gguf_type!r}; known: {', '.join(GGUF_TYPES)}")
    src = Path(checkpoint)
    out = converted_dir(src, gguf_type)
    if (out / GGUF_FILE).exists():
        return out / GGUF_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    try:
        tensors = load_tensors(src)
        write_gguf(src, tensors, gguf_type, tmp / GGUF_FILE)
        if gguf_type in QUANT_TYPES:
            write_twin(src, tensors, gguf_type, tmp / TWIN_DIR)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first; theirs is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / GGUF_FILE


def twin_checkpoint(checkpoint: str | Path, gguf_type: str) -> Path:
    """The HF checkpoint the reference loads for a quant type: same files, weights round-tripped."""
    return ensure_gguf(checkpoint, gguf_type).parent / TWIN_DIR


def load_tensors(checkpoint: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        tensors.update({k: v.astype(np.float32) for k, v in load_file(str(f)).items()})
    return tensors


def quantizable(name: str, w: np.ndarray, gguf_type: str) -> bool:
    """A 2-D weight whose rows are whole blocks of the type (the others stay F32)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block = GGML_QUANT_SIZES[GGMLQuantizationType[gguf_type.upper()]][0]
    return name.endswith(".weight") and w.ndim == 2 and w.shape[1] % block == 0


def round_trip(w: np.ndarray, gguf_type: str) -> np.ndarray:
    # [O, I] fp32 -> [O, I] fp32: what llama.cpp multiplies by once `w` is stored as `gguf_type`
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    qtype = GGMLQuantizationType[gguf_type.upper()]
    return quants.dequantize(quants.quantize(w, qtype), qtype).astype(np.float32)


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    # [H*D, ...] -> same shape: per head, rows (half, i) -> (i, half), llama.cpp's pair layout
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(config: dict, tensors: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """HF tensors -> (GGUF name, fp32 array in llama.cpp's row layout), in checkpoint order."""
    import gguf

    arch = getattr(gguf.MODEL_ARCH, ARCHS[config["model_type"]])
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    out = []
    for hf_name, w in tensors.items():
        if "rotary_emb" in hf_name:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no GGUF name for checkpoint tensor {hf_name!r} ({config['model_type']})")
        proj = hf_name.split(".")[-2]
        if config["model_type"] in PERMUTED_ROPE and proj in heads:
            w = permute_rope(w, heads[proj])
        out.append((name, w))
    return out


def write_gguf(checkpoint: Path, tensors: dict[str, np.ndarray], gguf_type: str, out: Path) -> None:
    import gguf

    config = json.loads((checkpoint / "config.json").read_text())
    if config.get("model_type") not in ARCHS:
        raise ValueError(f"llama.cpp conversion knows archs {', '.join(ARCHS)}; got {config.get('model_type')!r}")
    arch_name = gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, ARCHS[config["model_type"]])]
    writer = gguf.GGUFWriter(str(out), arch_name)
    write_hparams(writer, config, gguf_type)
    write_vocab(writer, checkpoint, config["vocab_size"])
    for name, w in gguf_tensors(config, tensors):
        add_tensor(writer, name, w, gguf_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_tensor(writer, name: str, w: np.ndarray, gguf_type: str) -> None:
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    if w.ndim < 2 or gguf_type == "f32":
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
    elif gguf_type == "f16":
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float16))
    elif quantizable(name, w, gguf_type):
        qtype = GGMLQuantizationType[gguf_type.upper()]
        writer.add_tensor(name, quants.quantize(w, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))


def write_hparams(writer, config: dict, gguf_type: str) -> None:
    import gguf

    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0)}
    if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise ValueError(f"llama.cpp conversion handles default RoPE only; got {rope}")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{gguf_type.upper()}", gguf.LlamaFileType.ALL_F32))


def write_vocab(writer, checkpoint: Path, vocab_size: int) -> None:
    """The checkpoint's byte-level BPE as llama.cpp's `gpt2` tokenizer (convert_hf_to_gguf's
    _set_vocab_gpt2): tokens by id, special tokens CONTROL, merges and special ids."""
    import gguf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    by_id = {i: t for t, i in tok.get_vocab().items()}
    special = set(tok.all_special_ids)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [
        gguf.TokenType.UNUSED if i not in by_id else gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
        for i in range(vocab_size)
    ]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the factory's ByteLevel pre-tokenizer splits with GPT-2's regex
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(checkpoint, load_merges=True).add_to_gguf(writer)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def write_twin(checkpoint: Path, tensors: dict[str, np.ndarray], gguf_type: str, out: Path) -> None:
    """HF checkpoint copy whose quantized weights are round-tripped (fp32, so nothing rounds twice)."""
    from safetensors.numpy import save_file

    shutil.copytree(checkpoint, out, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json", ".*"))
    twin = {k: round_trip(w, gguf_type) if quantizable(k, w, gguf_type) else w for k, w in tensors.items()}
    save_file(twin, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "quantization.json").write_text(json.dumps({"scheme": f"gguf-{gguf_type}", "source": str(checkpoint)}))
