"""The llama.cpp adapter: GGUF conversion, the ggml graph reader, taps, and runs in real workers."""

from __future__ import annotations

import numpy as np
import pytest

from tools.engines.llamacpp.gguf_convert import (
    ensure_gguf,
    permute_rope,
    round_trip,
    twin_checkpoint,
)
from tools.engines.llamacpp.taps import base_name, unpermute_heads
from tools.engines.protocol import RunJob
from tools.probe.checkpoints import ensure_checkpoint
from tools.scenario import from_dict


def scenario(arch: str = "llama", dtype: str = "float32", **options) -> dict:
    return {
        "model": {"arch": arch, "seed": 0},
        "target": {"engine": "llama.cpp", "dtype": dtype, "options": options},
        "workload": {
            "requests": [
                {"prompt_ids": [5, 17, 42, 99, 260, 301, 7], "max_tokens": 4, "sampling": {"ignore_eos": True}},
                {"prompt_ids": [9, 8, 7, 6], "max_tokens": 4, "sampling": {"ignore_eos": True}},
            ]
        },
    }


def gguf_tensor(path, name: str) -> np.ndarray:
    """A GGUF tensor as fp32 [rows, cols] (dequantized when stored quantized)."""
    from gguf import GGUFReader, quants

    t = next(t for t in GGUFReader(str(path)).tensors if t.name == name)
    return quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(int(n) for n in t.shape[::-1]))


# ---- pure ---------------------------------------------------------------------------------------


def test_unpermute_heads_undoes_the_converters_rope_permutation():
    w = np.arange(4 * 16 * 3, dtype=np.float32).reshape(64, 3)  # 4 heads of 16 rows
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    hf = x @ w.T  # [T, H*D] in HF's layout
    ggml = x @ permute_rope(w, 4).T  # what llama.cpp computes from the converted weight
    assert not np.allclose(hf, ggml)
    np.testing.assert_array_equal(unpermute_heads(ggml, 16), hf)


def test_layer_names_split_into_base_and_layer():
    assert base_name("Qcur-11") == ("Qcur", 11)
    assert base_name("result_output") == ("result_output", None)
    assert base_name("ffn_gate_par-0") == ("ffn_gate_par", 0)


# ---- conversion ----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_holds_the_checkpoint_weights_in_llama_cpp_layout(arch):
    from safetensors.numpy import load_file

    ckpt = ensure_checkpoint({"arch": arch, "seed": 0})
    hf = load_file(str(ckpt / "model.safetensors"))
    f32, f16 = ensure_gguf(ckpt, "f32"), ensure_gguf(ckpt, "f16")
    q = hf["model.layers.1.self_attn.q_proj.weight"]
    expected_q = permute_rope(q, 4) if arch == "llama" else q
    np.testing.assert_array_equal(gguf_tensor(f32, "blk.1.attn_q.weight"), expected_q)
    np.testing.assert_array_equal(
        gguf_tensor(f16, "blk.1.ffn_down.weight"), hf["model.layers.1.mlp.down_proj.weight"].astype(np.float16)
    )
    np.testing.assert_array_equal(gguf_tensor(f16, "output_norm.weight"), hf["model.norm.weight"])  # 1-D stays F32
    assert ensure_gguf(ckpt, "f32") == f32  # cached


def test_quantized_gguf_and_its_twin_hold_the_same_weights():
    from safetensors.numpy import load_file

    ckpt = ensure_checkpoint({"arch": "qwen2", "seed": 0})
    path, twin = ensure_gguf(ckpt, "q8_0"), twin_checkpoint(ckpt, "q8_0")
    hf, deq = load_file(str(ckpt / "model.safetensors")), load_file(str(twin / "model.safetensors"))
    w = deq["model.layers.0.mlp.up_proj.weight"]
    np.testing.assert_array_equal(gguf_tensor(path, "blk.0.ffn_up.weight"), w)
    np.testing.assert_array_equal(w, round_trip(hf["model.layers.0.mlp.up_proj.weight"], "q8_0"))
    assert 0 < np.abs(w - hf["model.layers.0.mlp.up_proj.weight"]).max() < 1e-3
    np.testing.assert_array_equal(
        deq["model.layers.0.self_attn.q_proj.bias"], hf["model.layers.0.self_attn.q_proj.bias"]
    )


# ---- llama.cpp itself ----------------------------------------------------------------------------


def test_llama_cpp_tokenizes_like_the_checkpoints_tokenizer():
    from transformers import AutoTokenizer

    from tools.engines.llamacpp.session import Session

    sc = from_dict(scenario())
    ckpt = ensure_checkpoint(sc.model)
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    text = "The quick brown fox, 12 345 naïve café: def f(x): return x * 2."
    with Session(RunJob(sc, sc.target, str(ckpt))) as s:
        ids = s.tokenize(text)
        assert ids == tok.encode(text, add_special_tokens=False)
        assert s.detokenize(ids) == text


def test_graph_reader_reads_nodes_sources_and_quantized_leaves():
    """Every node of a q8_0 graph: the logits node equals llama.cpp's own logits, a weight leaf
    equals the GGUF's dequantized tensor, sources are named."""
    from tools.engines.llamacpp.ggml import GraphReader
    from tools.engines.llamacpp.session import Session

    sc = from_dict(scenario(weights="q8_0"))
    with Session(RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)))) as s:
        s.reader = GraphReader(s.nodes.append, read_leaves=True)  # every node, and the leaves
        s.open_context(32, 1)
        logits = s.decode([(0, [5, 17, 42], 0)])[0]
        nodes, leaves, gguf = list(s.nodes), s.reader.leaves, s.gguf
    out = [n for n in nodes if n.name == "result_output"][-1]
    np.testing.assert_array_equal(out.data, logits)
    assert out.op == "MUL_MAT" and out.srcs == ("output.weight", out.srcs[1]) and out.shape == (3, 512)
    assert leaves["output.weight"].type == "q8_0"
    np.testing.assert_array_equal(leaves["output.weight"].data, gguf_tensor(gguf, "output.weight"))
    rope = next(n for n in nodes if n.name == "Kcur-0" and n.op == "ROPE")
    assert rope.shape == (3, 2, 16) and rope.srcs[1] == "inp_pos"
    np.testing.assert_array_equal(leaves["inp_pos"].data, [0, 1, 2])


def test_a_run_reports_canonical_taps_for_both_requests():
    from tools.engines.runner import run_engine

    sc = from_dict(scenario("qwen2", "float16"))
    trace = run_engine(RunJob(sc, sc.target, str(ensure_checkpoint(sc.model))), timeout=300)
    assert [len(o.output_ids) for o in trace.outputs] == [4, 4]
    taps = trace.taps()
    for tap in ("embed", "layers.0.attn.q", "layers.0.attn.k_rot", "layers.1.mlp.act", "layers.1.out", "logits"):
        assert tap in taps
    k = next(r for r in trace.records if r.name == "layers.0.attn.k" and r.request == 0 and r.step == 0)
    assert k.positions == list(range(7)) and tuple(k.tensor.shape) == (7, 32)  # 2 KV heads of 16
    decode = [r for r in trace.records if r.name == "logits" and r.request == 1 and r.step > 0]
    assert [r.positions for r in decode] == [[4], [5], [6]]


def test_options_it_cannot_tap_are_refused_in_one_line():
    from tools.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine()
    for options, dtype, words in (
        ({"weights": "q4_k"}, "float32", "K-quants"),
        ({"speculative": True}, "float32", "unknown options"),
        ({}, "bfloat16", "GGUF float types"),
    ):
        spec = from_dict(scenario(dtype=dtype, **options)).target
        with pytest.raises(ValueError, match=words):
            engine.check_options(spec)


def test_a_build_named_by_llama_cpp_lib_path_is_the_one_run(tmp_path, monkeypatch):
    """The worker drives (and reads graphs through) the libs in LLAMA_CPP_LIB_PATH, not the package's."""
    import shutil
    from pathlib import Path

    import llama_cpp

    from tools.engines.runner import run_engine

    build = tmp_path / "build"
    shutil.copytree(Path(llama_cpp.__file__).parent / "lib", build)
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(build))
    sc = from_dict(scenario())
    trace = run_engine(RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)), taps=["logits"]), timeout=300)
    assert trace.meta["source"] == str(build / "libllama.so")
    assert trace.taps() == ["logits"] and [len(o.output_ids) for o in trace.outputs] == [4, 4]


def test_mistral_runs_as_llama_and_a_sequence_past_its_window_is_refused():
    from tools.engines.llamacpp.session import Session

    sc = from_dict(scenario("mistral"))
    ckpt = str(ensure_checkpoint(sc.model))
    with Session(RunJob(sc, sc.target, ckpt)) as s:
        s.drive(s.plans())  # 7 + 4 tokens: inside the 32-token window
        assert {r.name for r in s.records} >= {"layers.1.attn.q_rot", "logits"}
    long = scenario("mistral")
    long["workload"]["requests"][0]["max_tokens"] = 40
    sc = from_dict(long)
    with Session(RunJob(sc, sc.target, ckpt)) as s, pytest.raises(ValueError, match="sliding window"):
        s.plans()
