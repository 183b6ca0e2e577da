"""tinyserve cases: incremental detokenization (tokenizer)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.tinyserve_history import (
    DETOK,
    MEI_LIN,
    NADIA_RAHMAN,
    RAFAEL_COSTA,
    README,
    SUBJECT,
    TARIQ,
    TOKENIZER,
    dated_steps,
    tinyserve_repro,
)


def case_detok_multibyte() -> CaseSpec:
    bug = [
        (
            DETOK,
            """    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text = decode(ids[prefix_offset:])
    if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
        return new_text[len(prefix_text):], read_offset, len(ids)
    return "", prefix_offset, read_offset
""",
            """    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text = decode(ids[prefix_offset:])
    if new_text.endswith(REPLACEMENT_CHAR):
        # stream what is complete now instead of stalling until the character finishes
        new_text = new_text.rstrip(REPLACEMENT_CHAR)
    if len(new_text) > len(prefix_text):
        return new_text[len(prefix_text):], read_offset, len(ids)
    return "", prefix_offset, read_offset
""",
        )
    ]
    history = dated_steps(
        [
            (
                "2025-07-01T09:15:22+00:00",
                NADIA_RAHMAN,
                "tokenizer: vocab_size property",
                [
                    (
                        TOKENIZER,
                        "    def encode(self, text: str) -> list[int]:\n",
                        "    @property\n    def vocab_size(self) -> int:\n        return self._tok.get_vocab_size()\n\n"
                        "    def encode(self, text: str) -> list[int]:\n",
                    )
                ],
            ),
            (
                "2025-07-03T13:42:10+02:00",
                TARIQ,
                "detokenizer: document take_delta's holdback",
                [
                    (
                        DETOK,
                        '''        """Text not yet streamed, keeping the last `holdback` characters back (a stop string may still
        match there and cut them) until the sequence finishes."""''',
                        '''        """Text not yet streamed, keeping the last `holdback` characters back (a stop string may still
        match there and cut them) until the sequence finishes. holdback is the longest stop string
        minus one: a match needs at least one new character."""''',
                    )
                ],
            ),
            (
                "2025-07-07T10:08:51+00:00",
                MEI_LIN,
                "detokenizer: take_touched docstring",
                [
                    (
                        DETOK,
                        "    def take_touched(self) -> list:\n",
                        '    def take_touched(self) -> list:\n        """Sequences whose text may have grown since the last call (streaming only)."""\n',
                    )
                ],
            ),
            (
                "2025-07-09T16:55:03+02:00",
                NADIA_RAHMAN,
                "detokenizer: stream complete text sooner\n\nA token that ends in the "
                "middle of a character no longer holds back the characters before it.",
                bug,
            ),
            (
                "2025-07-14T11:27:36+00:00",
                RAFAEL_COSTA,
                "detokenizer: DetokState field comments",
                [
                    (
                        DETOK,
                        "    prefix_offset: int = 0\n    read_offset: int = 0\n",
                        "    prefix_offset: int = 0      # first token of the window decoded for context\n"
                        "    read_offset: int = 0        # first token whose text was not emitted yet\n",
                    )
                ],
            ),
            (
                "2025-07-16T14:03:29+02:00",
                TARIQ,
                "tokenizer: decode docstring",
                [
                    (
                        TOKENIZER,
                        "    def decode(self, token_ids: list[int]) -> str:\n",
                        "    def decode(self, token_ids: list[int]) -> str:\n"
                        '        """Special tokens are left out (as serving APIs do by default)."""\n',
                    )
                ],
            ),
            (
                "2025-07-22T09:49:12+00:00",
                MEI_LIN,
                "README: streaming example",
                [
                    (
                        README,
                        "`LLMEngine.stream_step()` returns, per request that produced text,",
                        'Streaming: `for out in engine.stream_step(): print(out.delta, end="")`.\n\n'
                        "`LLMEngine.stream_step()` returns, per request that produced text,",
                    )
                ],
            ),
        ]
    )
    reqs = [
        {
            "prompt": "Héllo wörld, naïve café, 東京 and Straße are written with multi-byte characters.",
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
        {
            "prompt_ids": [411, 398, 391, 98, 122, 74, 174, 105, 171, 301, 26, 69],
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
        {
            "prompt_ids": [176, 166, 277, 412, 329, 377, 292, 31, 418, 243, 99, 497],
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
    ]
    return CaseSpec(
        subject=SUBJECT,
        id="ts-detok-multibyte",
        issue_number=1404,
        category="tokenizer",
        modeled_on=["vllm-project/vllm#8627", "NVIDIA/TensorRT-LLM#14312"],
        title="Returned text drops characters at multi-byte boundaries; token ids are right",
        issue=issue_text("ts-detok-multibyte"),
        repro=tinyserve_repro("llama", "float32", {}, reqs),
        truth_file=DETOK,
        truth_function="decode_increment",
        component="tokenizer",
        mechanism="incomplete trailing characters are stripped and the read offset advanced past their "
        "bytes, so the character they start is never emitted",
        steps=history,
        bug_index=4,
    )


CASES = [
    case_detok_multibyte(),
]
