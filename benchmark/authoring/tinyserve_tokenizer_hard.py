"""Hard-track tokenizer cases on tinyserve (issue 12: every category gets 3+ cases; issues 2001-2002).

    python -m benchmark.author ts-hard-detok-special-pieces ts-hard-detok-spec-last-piece

Each history is the shared stream (benchmark/authoring/tinyserve_stream.py, 34 commits with
release tags) with the case's own commits inserted: the culprit, and commits on the failing path
that change nothing there (or, for the spec-decode interaction, a commit that is right on its own
and only breaks together with a later one). `good_ref` is the v0.2.0 tag. Issue prose lives in
benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from pathlib import Path

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, stream_case
from benchmark.authoring.tinyserve_stream import DETOK, TOKENIZER, Commit

SUBJECT = "tinyserve"
ISSUES_DIR = Path(__file__).resolve().parent / "issues"
SPEC = "tinyserve/spec_decode/engine.py"

OLGA = "Olga Sørensen <olga.sorensen@posteo.de>"
MARCUS = "Marcus Webb <marcus.webb@tinyserve.dev>"
YUKI = "Yuki Hayashi <yuki.hayashi.dev@gmail.com>"


def case(id: str, number: int, *args) -> HardCase:
    """A tokenizer case on the shared stream (tinyserve_hard.stream_case)."""
    return stream_case(id, number, "tokenizer", *args)


def greedy(prompt_ids: list[int], max_tokens: int) -> dict:
    return {"prompt_ids": prompt_ids, "max_tokens": max_tokens, "sampling": {"temperature": 0.0, "ignore_eos": True}}


# ============================================================================= 2001 special tokens in the text

ENCODE_FLAG = Commit(
    "tokenizer: encode(add_special_tokens=...)\n\nPrompts are still encoded without special tokens by default; "
    "callers that\nbuild their own chat format can ask for them.",
    OLGA,
    [
        (
            TOKENIZER,
            "    def encode(self, text: str) -> list[int]:\n"
            "        return self._tok.encode(text, add_special_tokens=False).ids\n",
            "    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:\n"
            "        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids\n",
        )
    ],
)

PIECE_CACHE = Commit(
    "tokenizer: decode windows from cached byte-level pieces\n\nThe detokenizer decodes a short window of ids "
    "every step for every running\nrequest; a full decode call per window was a third of the step's CPU time\n"
    "at batch 64. Keep each id's piece once and join pieces with the\ntokenizer's own decoder.",
    MARCUS,
    [
        (
            TOKENIZER,
            '        self._tok = HFTokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))\n',
            '        self._tok = HFTokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))\n'
            "        self._pieces: dict[int, str] = {}     # id -> byte-level piece, filled as ids are decoded\n",
        ),
        (
            TOKENIZER,
            "    def decode(self, token_ids: list[int]) -> str:\n"
            "        return self._tok.decode(token_ids, skip_special_tokens=True)\n",
            "    def decode(self, token_ids: list[int]) -> str:\n"
            "        # joins cached pieces with the tokenizer's decoder (byte-level: bytes -> text, U+FFFD for\n"
            "        # an unfinished character), the same text as a full decode without the per-call setup\n"
            "        return self._tok.decoder.decode([self.piece(i) for i in token_ids])\n\n"
            "    def piece(self, token_id: int) -> str:\n"
            '        """The byte-level piece of one id, as tokenizer.json stores it."""\n'
            "        if token_id not in self._pieces:\n"
            "            self._pieces[token_id] = self._tok.id_to_token(token_id)\n"
            "        return self._pieces[token_id]\n",
        ),
    ],
)

DETOK_NAMES = Commit(
    "detokenizer: name the two window texts",
    YUKI,
    [
        (
            DETOK,
            "    prefix_text = decode(ids[prefix_offset:read_offset])\n"
            "    new_text = decode(ids[prefix_offset:])\n"
            "    if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):\n"
            "        return new_text[len(prefix_text):], read_offset, len(ids)\n",
            "    emitted = decode(ids[prefix_offset:read_offset])     # the window's text already handed out\n"
            "    window = decode(ids[prefix_offset:])                 # ... and with the new ids\n"
            "    if len(window) > len(emitted) and not window.endswith(REPLACEMENT_CHAR):\n"
            "        return window[len(emitted):], read_offset, len(ids)\n",
        )
    ],
)


def detok_special_pieces() -> HardCase:
    # llama seed 4: greedy output of these prompts contains <pad> / <s> (ids 0 and 1) within 24 tokens
    reqs = [
        greedy([357, 219, 454, 242, 416, 47, 16, 123, 389, 303, 384, 26, 35, 374, 148, 313, 249, 391], 24),
        greedy([356, 184, 258, 264, 460, 404, 30, 207, 17, 232, 491, 3, 196, 342, 310], 24),
        greedy([386, 122, 361, 304, 303, 356, 61, 479, 426, 79, 157, 7, 295, 302, 40, 93, 376, 184, 405], 24),
    ]
    return case(
        "ts-hard-detok-special-pieces",
        2001,
        ["vllm-project/vllm#1044", "vllm-project/vllm#1186", "tenstorrent/tt-inference-server#2148"],
        "Returned text contains <pad> and <s> markup after upgrading; token ids unchanged",
        repro_toml({"arch": "llama", "seed": 4}, {"engine": "tinyserve", "dtype": "float32"}, reqs, good_ref="v0.2.0"),
        (
            TOKENIZER,
            "Tokenizer.decode",
            "tokenizer",
            "decode joins the byte-level pieces of every id, special tokens included, so <pad>/<s>/</s> text "
            "lands in the output where the old decode(skip_special_tokens=True) left it out",
        ),
        {16: [DETOK_NAMES], 26: [PIECE_CACHE], 28: [ENCODE_FLAG]},
        PIECE_CACHE,
    )


# ============================================================================= 2002 spec decode x piece cache

SPEC_ONE_DECODE = Commit(
    "spec_decode: one detokenizer update per step\n\nA step that accepts k drafts decoded the text window k+1 times; "
    "append the\naccepted tokens (stopping at the first that ends the request on its id or\nlength), then decode once "
    "and check stop strings on the new text.",
    OLGA,
    [
        (
            SPEC,
            "        finished = []\n"
            "        for seq, tokens, lps, tops in zip(result.seqs, result.tokens, result.logprobs, result.tops):\n"
            "            del seq.token_ids[seq.num_tokens - (len(tokens) - 1):]\n"
            "            for token, lp, top in zip(tokens, lps, tops):\n"
            "                finished += self.process_outputs(StepResult([seq], [token], [lp], [top]))\n"
            "                if seq.is_finished:\n"
            "                    break\n"
            "        return finished\n",
            "        finished = []\n"
            "        for seq, tokens, lps, tops in zip(result.seqs, result.tokens, result.logprobs, result.tops):\n"
            "            del seq.token_ids[seq.num_tokens - (len(tokens) - 1):]\n"
            "            reason = None\n"
            "            for token, lp, top in zip(tokens, lps, tops):\n"
            "                seq.append_token(token, lp, None if top is None else {**top, token: lp})\n"
            "                reason = self.check_stop(seq)      # ids and length; the text catches up below\n"
            "                if reason:\n"
            "                    break\n"
            "            self.detokenizer.update(seq)           # one window decode for all of the step's tokens\n"
            "            reason = reason or self.check_stop(seq)\n"
            "            if reason:\n"
            "                self.scheduler.finish(seq, reason)\n"
            "                finished.append(self.make_output(seq))\n"
            "        return finished\n",
        ),
        (SPEC, "from tinyserve.engine.model_runner import StepResult\n", ""),
    ],
)

TOKENIZER_PIECES = (
    TOKENIZER,
    "    def decode(self, token_ids: list[int]) -> str:\n",
    "    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:\n"
    '        """Byte-level pieces of `token_ids`, special tokens left out (as decode leaves them out)."""\n'
    "        return [self._tok.id_to_token(i) for i in token_ids if i not in self._special_ids]\n\n"
    "    def convert_tokens_to_string(self, pieces: list[str]) -> str:\n"
    "        return self._tok.decoder.decode(pieces)\n\n"
    "    def decode(self, token_ids: list[int]) -> str:\n",
)

DETOK_PIECES = Commit(
    "detokenizer: keep each sequence's pieces instead of re-reading ids\n\nEvery update converted the whole window "
    "of ids back to pieces; convert each\nid once, when it arrives, and join the window from the kept pieces.",
    MARCUS,
    [
        (
            TOKENIZER,
            '        self._tok = HFTokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))\n',
            '        self._tok = HFTokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))\n'
            "        self._special_ids = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}\n",
        ),
        TOKENIZER_PIECES,
        (DETOK, "from dataclasses import dataclass\n", "from dataclasses import dataclass, field\n"),
        (
            DETOK,
            "    streamed: int = 0          # characters of seq.text already handed out by stream_step\n",
            "    streamed: int = 0          # characters of seq.text already handed out by stream_step\n"
            "    pieces: list = field(default_factory=list)   # byte-level pieces of the output ids (offsets index these)\n",
        ),
        (
            DETOK,
            "        st = self.states.setdefault(seq.seq_id, DetokState())\n"
            "        delta, st.prefix_offset, st.read_offset = decode_increment(\n"
            "            self.tokenizer.decode, seq.output_token_ids, st.prefix_offset, st.read_offset)\n",
            "        st = self.states.setdefault(seq.seq_id, DetokState())\n"
            "        # the id appended since the last update becomes a piece once; the window is joined from pieces\n"
            "        st.pieces += self.tokenizer.convert_ids_to_tokens(seq.output_token_ids[-1:])\n"
            "        delta, st.prefix_offset, st.read_offset = decode_increment(\n"
            "            self.tokenizer.convert_tokens_to_string, st.pieces, st.prefix_offset, st.read_offset)\n",
        ),
        (
            DETOK,
            "            seq.text += decode_remainder(self.tokenizer.decode, seq.output_token_ids, st.prefix_offset, "
            "st.read_offset)\n"
            "            st.prefix_offset = st.read_offset = len(seq.output_token_ids)     # a second finish adds nothing\n",
            "            seq.text += decode_remainder(self.tokenizer.convert_tokens_to_string, st.pieces, st.prefix_offset,\n"
            "                                         st.read_offset)\n"
            "            st.prefix_offset = st.read_offset = len(st.pieces)     # a second finish adds nothing\n",
        ),
    ],
)

SPEC_STATS_DOC = Commit(
    "spec_decode: document the acceptance counters",
    YUKI,
    [
        (
            SPEC,
            "        self.num_draft_tokens = self.num_accepted_tokens = 0  # statistics\n",
            "        # statistics: drafts proposed and accepted over the engine's life (acceptance rate = ratio)\n"
            "        self.num_draft_tokens = self.num_accepted_tokens = 0\n",
        )
    ],
)


def detok_spec_last_piece() -> HardCase:
    loop = [141, 77, 305, 19, 260]
    reqs = [
        greedy(loop * 4 + [141, 77], 20),
        greedy([88, 402, 88, 402, 88, 402, 13, 88, 402, 13], 16),
    ]
    return case(
        "ts-hard-detok-spec-last-piece",
        2002,
        ["vllm-project/vllm#28786", "vllm-project/vllm#20247", "NVIDIA/TensorRT-LLM#14312"],
        "With speculative decoding on, returned text is missing words; token ids are right",
        repro_toml(
            {"arch": "llama", "seed": 8},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"speculative": "ngram", "num_speculative_tokens": 3},
            },
            reqs,
            good_ref="v0.2.0",
        ),
        (
            DETOK,
            "Detokenizer.update",
            "tokenizer",
            "update converts only the last output id to a piece, but a speculative step appends all accepted "
            "tokens before one update, so the other accepted tokens never reach the text",
        ),
        {11: [SPEC_ONE_DECODE], 23: [SPEC_STATS_DOC], 27: [DETOK_PIECES]},
        DETOK_PIECES,
    )


CASES = [
    detok_special_pieces(),
    detok_spec_last_piece(),
]
