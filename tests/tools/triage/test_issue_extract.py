"""Scenario extraction from issue text (tools/triage/extract.py)."""

import pytest

from tools.triage.extract import extract_scenario, find_good_ref, find_options, to_scenario

VLLM_ISSUE = """vLLM version: 0.5.3.post1

```python
from vllm import LLM, SamplingParams
llm = LLM(model="meta-llama/Meta-Llama-3.1-8B-Instruct", dtype="bfloat16", enable_prefix_caching=True,
          enable_chunked_prefill=True, tensor_parallel_size=2, block_size=32)
params = SamplingParams(temperature=0, max_tokens=256)
prompts = ["Hello, my name is", "The capital of France is"]
```
This worked in v0.5.1."""


def test_vllm_issue_gives_a_runnable_scenario():
    partial, missing = extract_scenario("Gibberish with prefix caching", VLLM_ISSUE)
    assert partial["model"] == {"path": "meta-llama/Meta-Llama-3.1-8B-Instruct", "arch": "llama"}
    assert partial["target"]["engine"] == "vllm" and partial["target"]["dtype"] == "bfloat16"
    assert partial["target"]["options"] == {
        "prefix_caching": True,
        "chunked_prefill": True,
        "tp_size": 2,
        "block_size": 32,
    }
    assert partial["meta"]["engine_version"] == "0.5.3.post1" and partial["good_ref"] == "v0.5.1"
    reqs = partial["workload"]["requests"]
    assert [r["prompt"] for r in reqs] == ["Hello, my name is", "The capital of France is"]
    assert reqs[0]["max_tokens"] == 256 and reqs[0]["sampling"] == {"temperature": 0.0}
    assert missing == []
    scenario = to_scenario(partial)
    assert scenario is not None and len(scenario.requests) == 2 and scenario.good_ref == "v0.5.1"


def test_llama_cpp_command_line():
    body = (
        'Since b4850, `./llama-cli -m Qwen2.5-7B-Instruct-Q4_K_M.gguf -sm row -n 64 --temp 0 -p "Write a haiku"` '
        "outputs gibberish. b4800 was fine."
    )
    partial, missing = extract_scenario("Gibberish with -sm row", body)
    assert partial["target"]["engine"] == "llama.cpp"
    assert partial["model"] == {"path": "Qwen2.5-7B-Instruct-Q4_K_M.gguf", "arch": "qwen2"}
    assert partial["workload"]["requests"] == [
        {"prompt": "Write a haiku", "max_tokens": 64, "sampling": {"temperature": 0.0}}
    ]
    assert partial["good_ref"] == "b4800" and partial["meta"]["engine_version"] == "b4850"
    assert missing == ["dtype"]


def test_vague_issue_reports_what_is_missing():
    partial, missing = extract_scenario("outputs worse than the HF space?", "answers are dumber than on the demo")
    assert to_scenario(partial) is None
    assert missing[:2] == ["model", "prompts"] and "engine" in missing and "good_ref" in missing


def test_transformers_is_the_reference_when_another_engine_is_named():
    partial, _ = extract_scenario("vLLM differs from HF transformers", "Comparing vllm 0.5.0 with transformers, fp16")
    assert partial["target"]["engine"] == "vllm" and partial["target"]["dtype"] == "float16"


def test_options_take_the_failing_side_of_a_contrast():
    assert find_options("With TP=1 it is stable. With tensor_parallel_size=2 garbage.")["tp_size"] == 2
    assert find_options("With `enable_prefix_caching=False` both answers are correct.")["prefix_caching"] is True
    assert find_options("enable_prefix_caching=False") == {"prefix_caching": False}
    assert find_options("`--enable-chunked-prefill --max-num-seqs 4` and batch size 8") == {
        "chunked_prefill": True,
        "batch_size": 8,
    }


def test_good_ref_phrasings():
    assert find_good_ref("worked in v0.4.2") == "v0.4.2"
    assert find_good_ref("Downgrading to 0.5.5 fixes it") == "v0.5.5"
    assert find_good_ref("after upgrading from 0.10.1 to 0.10.2") == "v0.10.1"
    assert find_good_ref("it never worked") is None


def test_prompts_given_in_prose_as_a_list_of_quoted_strings():
    """Regression (issue 16): a numbered list of quoted prompts was not understood."""
    body = (
        'Llama-3 8B on vllm gives garbage for these prompts:\n\n1. "The capital of France is"\n'
        "2) \"Once upon a time\"\n- 'Translate to German: cat'\n* “Smart quotes too” (it rambles)\n"
        '\nThe list 1. of things "without" a quote first is not a prompt.\n'
    )
    partial, missing = extract_scenario("", body)
    assert [r["prompt"] for r in partial["workload"]["requests"]] == [
        "The capital of France is",
        "Once upon a time",
        "Translate to German: cat",
        "Smart quotes too",
    ]
    assert "prompts" not in missing and to_scenario(partial) is not None


def test_missing_fields_are_named_in_the_error():
    from tools.errors import BadInput
    from tools.triage.extract import require_scenario

    with pytest.raises(BadInput, match=r"missing: model .*; prompts \("):
        require_scenario(extract_scenario("Wrong output", "Since the upgrade the output is wrong.")[0])
    with pytest.raises(BadInput, match=r"missing: prompts \(") as e:
        require_scenario(extract_scenario("Llama-3 is wrong", "With meta-llama/Llama-3.1-8B the output is off.")[0])
    assert "model (" not in str(e.value)
