"""The tinyserve adapter: canonical taps from a real worker process, equal to transformers."""

import pytest
import torch

from tools.engines.protocol import RunJob
from tools.engines.runner import DIFFDX_ROOT, run_engine
from tools.engines.tinyserve import TinyServeEngine
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.taps import HEAD_TAPS, LAYER_TAPS, order_key, split
from tools.scenario import from_dict

SOURCE_ROOT = DIFFDX_ROOT / "benchmark" / "subjects" / "tinyserve"
torch.set_num_threads(1)


def scenario(arch, options=None, dtype="float32"):
    g = torch.Generator().manual_seed(0)
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {
                "engine": "tinyserve",
                "dtype": dtype,
                "options": options
                or {"prefix_caching": True, "chunked_prefill": True, "max_num_batched_tokens": 24, "block_size": 4},
            },
            "workload": {
                "requests": [
                    {"prompt_ids": torch.randint(3, 512, (41,), generator=g).tolist(), "max_tokens": 4},
                    {
                        "prompt": "The quick brown fox jumps over",
                        "max_tokens": 3,
                        "arrival_step": 2,
                        "sampling": {"temperature": 0.8, "top_k": 20, "seed": 3},
                    },
                ]
            },
        }
    )


def job(sc, **kw):
    return RunJob(scenario=sc, spec=sc.target, checkpoint=str(ensure_checkpoint(sc.model)), **kw)


@pytest.fixture(scope="module")
def gemma_trace():
    return run_engine(job(scenario("gemma2")), source_root=SOURCE_ROOT)


def test_worker_runs_the_tree_under_test(gemma_trace):
    assert gemma_trace.meta["tinyserve_file"].startswith(str(SOURCE_ROOT))
    assert gemma_trace.meta["options"]["enable_prefix_caching"] is True
    assert set(gemma_trace.meta["kernels"].values()) == {"optimized"}
    assert [len(o.output_ids) for o in gemma_trace.outputs] == [4, 3]
    assert gemma_trace.outputs[1].text is not None and gemma_trace.outputs[0].finish_reason == "length"


def test_a_tree_whose_tinyserve_fails_to_import_fails_the_run(tmp_path):
    """Regression (issue 16): the adapter fell back to the bundled tinyserve when the tree under
    test raised ImportError on import, so a broken fork was probed as the pristine one ("agree")."""
    from tools.engines.runner import EngineRunError

    pkg = tmp_path / "tinyserve"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from tinyserve.missing_module import Engine  # a broken fork\n")
    with pytest.raises(EngineRunError, match="missing_module"):
        run_engine(job(scenario("llama")), source_root=tmp_path)


def test_taps_are_canonical_and_in_execution_order(gemma_trace):
    names = gemma_trace.taps()
    for name in names:
        layer, tap = split(name)
        assert tap in (LAYER_TAPS if layer is not None else ("embed",) + HEAD_TAPS), name
    assert {split(n)[1] for n in names} >= set(LAYER_TAPS)  # gemma2 has every layer tap
    keys = [(r.step, order_key(r.name), r.request) for r in gemma_trace.records]
    assert keys == sorted(keys)
    for r in gemma_trace.records:
        assert r.tensor.dtype == torch.float32 and r.tensor.ndim == 2 and r.tensor.shape[0] == len(r.positions)
    # chunked prefill: request 0's 41 prompt tokens arrive as 24 + 17 rows
    embeds = [r for r in gemma_trace.records if r.name == "embed" and r.request == 0]
    assert [r.positions[0] for r in embeds[:3]] == [0, 24, 41]
    q = next(r for r in gemma_trace.records if r.name == "layers.0.attn.q")
    k = next(r for r in gemma_trace.records if r.name == "layers.0.attn.k")
    assert q.tensor.shape[1] == 64 and k.tensor.shape[1] == 32  # fused qkv split back


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_teacher_forced_logits_equal_transformers(arch):
    from transformers import AutoModelForCausalLM

    sc = scenario(arch, options={"block_size": 16})
    free = run_engine(job(sc, taps=[]), source_root=SOURCE_ROOT)
    assert free.records == []
    forced = run_engine(
        job(sc, teacher=free.sequences(), taps=["logits", "layers.0.attn.q", "layers.1.mlp.up"]),
        source_root=SOURCE_ROOT,
    )
    assert forced.sequences() == free.sequences()
    hf = AutoModelForCausalLM.from_pretrained(
        str(ensure_checkpoint(sc.model)), dtype=torch.float32, attn_implementation="eager"
    )
    seen = {}
    hooks = [
        hf.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.update(q=o[0])),
        hf.model.layers[1].mlp.up_proj.register_forward_hook(lambda m, i, o: seen.update(up=o[0])),
    ]
    try:
        for req, seq in enumerate(forced.sequences()):
            with torch.no_grad():
                logits = hf(torch.tensor([seq])).logits[0]
            for name, ref in (("logits", logits), ("layers.0.attn.q", seen["q"]), ("layers.1.mlp.up", seen["up"])):
                recs = [r for r in forced.records if r.name == name and r.request == req]
                rows = torch.cat([r.tensor for r in recs])
                positions = [p for r in recs for p in r.positions]
                torch.testing.assert_close(rows, ref[positions], atol=1e-4, rtol=1e-4)
            n_out = len(forced.outputs[req].output_ids)
            assert positions_of(forced, "logits", req) == list(range(len(seq) - n_out - 1, len(seq) - 1))
    finally:
        for h in hooks:
            h.remove()


def positions_of(trace, name, req):
    return [p for r in trace.records if r.name == name and r.request == req for p in r.positions]


def test_native_kernels_and_capabilities():
    eng = TinyServeEngine()
    caps = eng.capabilities()
    assert "paged_attention" in caps.kernels and caps.teacher_forcing
    trace = eng.run(job(scenario("llama"), taps=["sampler.*"], native_kernels=["paged_attention"]))
    assert trace.meta["kernels"]["paged_attention"] == "native"
    assert {r.name for r in trace.records} == {"sampler.logits", "sampler.probs", "sampler.token"}
    tokens = [int(r.tensor[0, 0]) for r in trace.records if r.name == "sampler.token" and r.request == 0]
    assert tokens == trace.outputs[0].output_ids
