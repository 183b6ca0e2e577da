"""tinyserve incremental detokenization with the checkpoint's byte-level BPE tokenizer: streamed
text adds up to the full decoding, multi-byte characters and leading spaces included."""

import random

import pytest
import torch
from tinyserve import LLMEngine, SamplingParams
from tinyserve.detokenizer import decode_increment, decode_remainder
from tinyserve.tokenizer import Tokenizer

from benchmark.subjects import check_tinyserve  # noqa: F401  (puts the subject on sys.path)
from tools.probe.checkpoints import ensure_checkpoint

torch.set_num_threads(1)
TEXTS = [
    "Héllo wörld, naïve café, 東京 and Straße.",
    "  two leading spaces, then 東京タワー é and a tab\tend",
    " 12,345 und Übergrößen: ÄÖÜ 😀 done",
]


@pytest.fixture(scope="module")
def ckpt():
    return str(ensure_checkpoint({"arch": "llama", "seed": 0}))


@pytest.fixture(scope="module")
def tok(ckpt):
    return Tokenizer(ckpt)


def stream(decode, ids):
    """Feed ids one at a time -> the pieces emitted (the last one is the final flush)."""
    pieces, prefix, read = [], 0, 0
    for n in range(1, len(ids) + 1):
        delta, prefix, read = decode_increment(decode, ids[:n], prefix, read)
        pieces.append(delta)
    pieces.append(decode_remainder(decode, ids, prefix, read))
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_full_decoding(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    pieces = stream(tok.decode, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)  # never half a character


def byte_token(b: int) -> str:
    """GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves, the rest map to 256+."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    return chr(b) if b in keep else chr(256 + sorted(set(range(256)) - set(keep)).index(b))


@pytest.mark.parametrize("text", [" 東", "é!", " 😀x"])
def test_a_character_split_over_byte_tokens_comes_out_whole(tok, text):
    byte_ids = [tok._tok.token_to_id(byte_token(b)) for b in text.encode()]
    assert None not in byte_ids and tok.decode(byte_ids) == text
    pieces = stream(tok.decode, byte_ids)
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert pieces[0] == (" " if text[0] == " " else "")  # the leading space is not lost or delayed


def test_random_token_sequences_stream_to_their_decoding(tok):
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(0, 512) for _ in range(rng.randrange(1, 25))]
        assert "".join(stream(tok.decode, ids)) == tok.decode(ids)


def test_engine_streams_deltas_that_add_up_to_request_text(ckpt, tok):
    engine = LLMEngine.from_options(ckpt, block_size=4)
    forced = {str(i): tok.encode(t) for i, t in enumerate(TEXTS)}
    for rid, ids in forced.items():  # teacher forcing makes the engine emit exactly these tokens
        engine.add_request(rid, "The quick brown fox", SamplingParams(max_tokens=len(ids)), forced_token_ids=ids)
    pieces, final = {rid: [] for rid in forced}, {}
    while engine.has_unfinished_requests():
        for out in engine.stream_step():
            pieces[out.request_id].append(out.delta)
            assert out.text.startswith("".join(pieces[out.request_id]))
            if out.finished:
                final[out.request_id] = out.text
    for i, text in enumerate(TEXTS):
        assert "".join(pieces[str(i)]) == final[str(i)] == text


def test_stop_string_cuts_streamed_text_and_is_never_streamed_past(ckpt):
    params = dict(temperature=0.0, max_tokens=16, ignore_eos=True)
    engine = LLMEngine.from_options(ckpt)
    engine.add_request("0", "Once upon a time", SamplingParams(**params))
    while engine.has_unfinished_requests():
        outs = engine.step()
    base = outs[0].text
    stop = base[4:7]
    assert len(stop) == 3 and base.find(stop) >= 0
    engine.add_request("1", "Once upon a time", SamplingParams(**params, stop=[stop]))
    streamed, out = "", None
    while engine.has_unfinished_requests():
        for o in engine.stream_step():
            streamed += o.delta
            out = o
    assert out.finished and out.finish_reason == "stop"
    assert streamed == out.text == base[: base.find(stop)]
