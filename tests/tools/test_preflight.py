"""Up-front checks (tools/preflight.py): each bad input is refused with a line that says what to
change; good input passes and names the source tree to use. What an engine takes is asked of a
worker that imports the tree under test, as engine runs do."""

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tools.errors import BadInput
from tools.preflight import canonical_taps, check_limits, check_taps, check_target_source, model_config, preflight
from tools.scenario import loads

SCENARIO = """
[model]
arch = "llama"
num_hidden_layers = 3
[target]
engine = "tinyserve"
options = { block_size = 16, prefix_caching = true }
[[workload.requests]]
prompt_ids = [1, 2, 3]
max_tokens = 8
"""


def test_good_input_passes_and_resolves_the_source(tmp_path):
    (tmp_path / "tinyserve").mkdir()
    assert preflight(loads(SCENARIO), tmp_path, ["layers.2.*", "logits"]) == tmp_path.resolve()
    assert preflight(loads(SCENARIO)) is None


def test_taps_are_checked_against_the_model_s_layers():
    config = model_config(loads(SCENARIO).model)
    assert "layers.2.out" in canonical_taps(config) and "layers.3.out" not in canonical_taps(config)
    check_taps(["layers.*.attn.q", "sampler.*"], config)
    with pytest.raises(BadInput, match="'layers.3.out' matches no tap"):
        check_taps(["embed", "layers.3.out"], config)


def test_limits_use_the_model_s_positions():
    sc = loads(SCENARIO.replace("max_tokens = 8", "max_tokens = 1022"))
    check_limits(sc, {"max_position_embeddings": 1025, "vocab_size": 512})
    with pytest.raises(BadInput, match=r"prompt \(3 tokens\) \+ max_tokens \(1,022\) exceeds the model's 1024"):
        check_limits(sc, {"max_position_embeddings": 1024})


def test_target_source_must_hold_the_engine_package(tmp_path):
    with pytest.raises(BadInput, match="holds no `transformers/` package"):
        check_target_source("transformers", tmp_path)
    (tmp_path / "transformers").mkdir()
    with pytest.raises(BadInput, match=f"did you mean its parent {tmp_path}"):
        check_target_source("transformers", tmp_path / "transformers")


def test_unknown_option_suggests_the_close_name():
    sc = loads(SCENARIO.replace("prefix_caching = true", "prefix_cachin = true"))
    with pytest.raises(BadInput, match="did you mean prefix_caching"):
        preflight(sc)


def test_model_path_without_config(tmp_path):
    sc = loads(SCENARIO.replace('arch = "llama"', f'path = "{Path(tmp_path)}"'))
    with pytest.raises(BadInput, match="has no config.json"):
        preflight(sc)


def test_factory_keys_beside_a_model_path_are_refused_not_ignored(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    sc = loads(SCENARIO.replace('arch = "llama"', f'path = "{Path(tmp_path)}"\nperturb_init = true'))
    with pytest.raises(BadInput, match="perturb_init only shape"):
        preflight(sc)


def test_dynamic_ntk_past_the_limit_is_refused_with_the_reason():
    """Found while checking a dropped hard case: past max_position_embeddings with dynamic NTK RoPE,
    bug-free tinyserve parts from the teacher-forced reference at layers.0.attn.q_rot (ratio 1.1e4):
    the single reference forward rescales the prompt's positions too, the KV-cached engine does not."""
    sc = loads(SCENARIO.replace("max_tokens = 8", "max_tokens = 1022"))
    dynamic = {"max_position_embeddings": 1024, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    with pytest.raises(
        BadInput, match=r"exceeds the model's 1024 positions .*dynamic NTK RoPE past it is not comparable"
    ):
        check_limits(sc, dynamic)
    with pytest.raises(BadInput) as plain:
        check_limits(sc, {"max_position_embeddings": 1024, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert "dynamic" not in str(plain.value)


TOY_DIR = Path(__file__).resolve().parent  # holds toy_engine.py, a third engine in one file
TOY_SCENARIO = SCENARIO.replace('engine = "tinyserve"', 'engine = "toy_engine:ToyEngine"')


def test_an_adapter_only_the_tree_holds_is_checked_by_what_that_tree_declares(tmp_path):
    """Regression (issue 15): preflight imported the adapter in this process, so an engine named
    `module:Class` that only the tree under test holds was refused as unknown. Its package and
    options now come from the capabilities a worker reads in that tree."""
    tree = tmp_path / "fork"
    tree.mkdir()
    toy = (TOY_DIR / "toy_engine.py").read_text()
    declared = "kernels=(), accepted_options=('block_size', 'prefix_caching')"
    (tree / "toy_engine.py").write_text(toy.replace("kernels=()", declared))
    assert preflight(loads(TOY_SCENARIO), tree) == tree.resolve()
    with pytest.raises(BadInput, match=r"options \['prefix_cachin'\] are not accepted by toy_engine:ToyEngine"):
        preflight(loads(TOY_SCENARIO.replace("prefix_caching = true", "prefix_cachin = true")), tree)
    with pytest.raises(BadInput, match="unknown engine 'toy'"):
        preflight(loads(SCENARIO.replace('engine = "tinyserve"', 'engine = "toy"')), tree)


def test_options_are_those_of_the_tree_under_test(tmp_path):
    """A fork whose Config takes one more option passes with it; the bundled tinyserve refuses it."""
    from tools.engines.runner import DIFFDX_ROOT

    fork = tmp_path / "fork"
    shutil.copytree(DIFFDX_ROOT / "benchmark" / "subjects" / "tinyserve", fork)
    config = fork / "tinyserve" / "config.py"
    config.write_text(
        config.read_text().replace(
            "    block_size: int = 16\n", "    block_size: int = 16\n    fork_knob: int = 0\n", 1
        )
    )
    sc = loads(SCENARIO.replace("prefix_caching = true", "fork_knob = 1"))
    assert preflight(sc, fork) == fork.resolve()
    with pytest.raises(BadInput, match=r"options \['fork_knob'\] are not accepted by tinyserve"):
        preflight(sc)


PATH_SCENARIO = """
[model]
path = "{path}"
arch = "llama"
{extra}
[target]
engine = "transformers"
[[workload.requests]]
prompt_ids = [1, 2, 3]
max_tokens = 2
"""


def test_config_keys_beside_a_real_checkpoint_are_refused_with_how_to_set_them(tmp_path):
    """Regression: HF config keys beside model.path (sliding_window, num_hidden_layers, torch_dtype, ...)
    reached neither engine, which both read the folder's config.json, and the run went on as if they
    applied. Now the probe CLI refuses them (exit 2, one line, no traceback) naming each key and where
    to set it; path with only arch beside it passes and reads the checkpoint's own config."""
    import subprocess
    import sys

    from tools.probe.checkpoints import ensure_checkpoint

    checkpoint = ensure_checkpoint({"arch": "llama", "seed": 0})
    extra = 'sliding_window = 8\nnum_hidden_layers = 3\ntorch_dtype = "float16"\nseed = 3'
    toml = tmp_path / "s.toml"
    toml.write_text(PATH_SCENARIO.format(path=checkpoint, extra=extra))
    run = subprocess.run(
        [sys.executable, "-m", "tools.probe.prober", "--scenario", str(toml)], capture_output=True, text=True
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "num_hidden_layers, sliding_window, torch_dtype would not reach either engine" in run.stderr
    assert f"{checkpoint}/config.json" in run.stderr and "seed only shape(s) a seeded checkpoint" in run.stderr
    plain = loads(PATH_SCENARIO.format(path=checkpoint, extra=""))
    assert preflight(plain) is None
    assert model_config(plain.model)["num_hidden_layers"] == 2  # the checkpoint's own


def test_a_model_key_one_typo_from_a_config_field_is_refused():
    """Regression: `num_hidden_layer = 3` went to AutoConfig as an unused attribute, the model kept
    its 2 layers and the run said nothing. Keys near no field still pass through (an engine may read them)."""
    sc = loads(SCENARIO.replace("num_hidden_layers = 3", "num_hidden_layer = 3"))
    with pytest.raises(BadInput, match="num_hidden_layer is not a llama config field; did you mean num_hidden_layers"):
        preflight(sc)
    assert model_config(loads(SCENARIO.replace("num_hidden_layers = 3", "engine_hint = 3")).model)["engine_hint"] == 3
    assert model_config(loads(SCENARIO.replace("num_hidden_layers = 3", "rope_theta = 5e5")).model)["rope_theta"] == 5e5


def test_a_text_prompt_past_the_model_s_positions_is_bad_input():
    """Regression: a text prompt of 4,800 tokens on a 1,024-position model passed preflight (a text
    prompt counted as one token) and failed inside the engine: exit 3 and the engine's traceback."""
    sc = loads(SCENARIO.replace("prompt_ids = [1, 2, 3]", f'prompt = "{"hello world " * 800}"'))
    with pytest.raises(
        BadInput, match=r"request 0: prompt \((at least )?\d{4} tokens\) .* 1024 positions .*shorten the prompt"
    ):
        preflight(sc)
    preflight(loads(SCENARIO.replace("prompt_ids = [1, 2, 3]", 'prompt = "hello world"')))


def test_a_config_value_the_factory_refuses_is_bad_input():
    """Regression: initializer_range = 1e30 passed preflight; the checkpoint's build raised transformers'
    validation error as a traceback, exit 1 (the code for "diverged")."""
    sc = loads(SCENARIO.replace("num_hidden_layers = 3", "initializer_range = 1e30"))
    with pytest.raises(BadInput, match="config refuses these keys: .*initializer_range.*1e\\+30"):
        preflight(sc)


def test_a_sampling_key_the_target_does_not_honour_is_refused_not_ignored():
    """transformers' generate() has no presence / frequency penalty: a request asking for one against it would
    diverge from the reference sampler (which applies it) for the adapter's sake, not a bug's. Refused up front;
    the neutral value passes, and tinyserve (which honours every key) takes it."""
    penalised = SCENARIO.replace(
        "max_tokens = 8", "max_tokens = 8\nsampling = { temperature = 0.8, seed = 1, presence_penalty = 0.4 }"
    )
    on_hf = penalised.replace(
        'engine = "tinyserve"\noptions = { block_size = 16, prefix_caching = true }', 'engine = "transformers"'
    )
    with pytest.raises(BadInput, match=r"request 0: sampling \['presence_penalty'\] is not honoured by transformers"):
        preflight(loads(on_hf))
    preflight(loads(on_hf.replace("presence_penalty = 0.4", "presence_penalty = 0.0")))
    preflight(loads(penalised))


def test_cuts_and_seed_of_a_greedy_request_are_moot_for_an_engine_that_does_not_sample():
    from tools.scenario import unhonoured_sampling

    greedy_only = ("ignore_eos", "seed", "logprobs")
    assert unhonoured_sampling({"temperature": 0.0, "top_k": 50, "top_p": 0.9}, greedy_only) == []
    assert unhonoured_sampling({"temperature": 0.7, "top_k": 50}, greedy_only) == ["temperature", "top_k"]
    assert unhonoured_sampling({"presence_penalty": 0.3}, greedy_only) == ["presence_penalty"]
    assert unhonoured_sampling({"presence_penalty": 0.3}, None) == []


def test_a_text_prompt_is_counted_as_the_target_engine_encodes_it(tmp_path):
    """Regression: preflight counted a text prompt with transformers' tokenizer, not the engine's: a tree
    whose tokenizer adds BOS and EOS feeds 2 tokens more than preflight counted, so a prompt at the limit
    passed preflight and overran in the engine. The count now comes from the tree's adapter (a worker)."""
    from tools.engines.runner import DIFFDX_ROOT
    from tools.preflight import least_counter

    fork = tmp_path / "fork"
    shutil.copytree(DIFFDX_ROOT / "benchmark" / "subjects" / "tinyserve", fork)
    tokenizer = fork / "tinyserve" / "tokenizer.py"
    plain = "        return self._tok.encode(text, add_special_tokens=False).ids\n"
    assert plain in tokenizer.read_text()
    bos_eos = "        return [1] + self._tok.encode(text, add_special_tokens=False).ids + [2]\n"
    tokenizer.write_text(tokenizer.read_text().replace(plain, bos_eos))
    text = "Once upon a time there was a small language model"
    sc = loads(SCENARIO.replace("prompt_ids = [1, 2, 3]", f'prompt = "{text}"'))
    n = least_counter(sc.model, {"vocab_size": 512})(text)
    at_limit = sc.with_requests([replace(sc.requests[0], max_tokens=1024 - n)])
    assert preflight(at_limit) is None  # the bundled tinyserve feeds n tokens
    with pytest.raises(BadInput, match=rf"prompt \({n + 2} tokens\) \+ max_tokens \({1024 - n:,}\) exceeds"):
        preflight(at_limit, fork)


def test_a_key_of_another_arch_is_refused_only_where_the_run_would_ignore_it(tmp_path):
    """Regression: gemma2's attn_logit_softcapping on a llama reached config.json, the reference's llama model
    and tinyserve both ignored it, and the probe said "agree" about a setting it never ran. A tree whose
    engine reads the key (reads a key its arch does not use: a bug for the probe to find) is let through."""
    from tools.engines.runner import DIFFDX_ROOT

    sc = loads(SCENARIO.replace("num_hidden_layers = 3", "attn_logit_softcapping = 50.0"))
    with pytest.raises(BadInput, match="attn_logit_softcapping belong.s. to the gemma2 config, not llama's"):
        preflight(sc)
    fork = tmp_path / "fork"
    shutil.copytree(DIFFDX_ROOT / "benchmark" / "subjects" / "tinyserve", fork)
    config = fork / "tinyserve" / "config.py"
    gated = 'attn_logit_softcapping=hf.get("attn_logit_softcapping") if gemma else None'
    assert gated in config.read_text()
    config.write_text(config.read_text().replace(gated, 'attn_logit_softcapping=hf.get("attn_logit_softcapping")'))
    assert preflight(sc, fork) == fork.resolve()


def test_a_model_the_target_engine_does_not_serve_is_bad_input_up_front():
    """llama.cpp has no gemma2 graph and runs mistral without its sliding window (as its adapter declares):
    a gemma2 model, or a mistral request past the 32-token window, would fail or differ from the reference
    for that reason alone; refused before any run, with the reason. Within the window mistral passes."""
    from tools.scenario import from_dict

    def scenario(arch: str, prompt: int, max_tokens: int):
        return from_dict(
            {
                "model": {"arch": arch, "seed": 0},
                "target": {"engine": "llama.cpp", "dtype": "float32"},
                "workload": {"requests": [{"prompt_ids": list(range(3, 3 + prompt)), "max_tokens": max_tokens}]},
            }
        )

    with pytest.raises(
        BadInput,
        match=r"\[model\] llama.cpp runs llama, mistral, qwen2 models only, not gemma2 \(the tree under test\)",
    ):
        preflight(scenario("gemma2", 10, 4))
    with pytest.raises(
        BadInput,
        match="request 0 .*: 40 tokens pass mistral's 32-token sliding window, which llama.cpp does not implement",
    ):
        preflight(scenario("mistral", 34, 6))
    preflight(scenario("mistral", 26, 6))
    preflight(scenario("qwen2", 34, 6))
