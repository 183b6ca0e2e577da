"""Incremental detokenization: text per step from a growing list of token ids.

Byte-level BPE tokens are byte strings, so one character (é is 2 bytes, 東 is 3)
may be split over several tokens. Decoding each new token alone would emit
replacement characters; re-decoding everything each step is quadratic. Instead
(as TGI and vLLM do) each sequence keeps two offsets into its output ids:

    prefix_offset .. read_offset   tokens whose text was already emitted
    read_offset ..                 tokens not yet emitted

The new text is decode(ids[prefix:]) minus decode(ids[prefix:read]); it is
emitted only when it does not end in U+FFFD (an unfinished character), and then
both offsets move forward. Decoding from `prefix_offset` rather than
`read_offset` keeps leading spaces and characters that span the boundary right.
At the end the remainder is emitted as is, so the streamed pieces always add up
to decode(all ids).
"""
from __future__ import annotations

from dataclasses import dataclass

REPLACEMENT_CHAR = "\ufffd"


@dataclass
class DetokState:
    prefix_offset: int = 0
    read_offset: int = 0
    streamed: int = 0          # characters of seq.text already handed out by stream_step


def decode_increment(decode, ids: list[int], prefix_offset: int, read_offset: int) -> tuple[str, int, int]:
    """-> (new text, new prefix_offset, new read_offset)."""
    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text = decode(ids[prefix_offset:])
    if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
        return new_text[len(prefix_text):], read_offset, len(ids)
    return "", prefix_offset, read_offset


def decode_remainder(decode, ids: list[int], prefix_offset: int, read_offset: int) -> str:
    """Whatever is still held back (an unfinished character at the very end comes out as U+FFFD)."""
    return decode(ids[prefix_offset:])[len(decode(ids[prefix_offset:read_offset])):]


class Detokenizer:
    """Keeps `seq.text` equal to the decoded output so far, one token at a time."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[int, DetokState] = {}
        self.streaming = False                    # set by the first stream_step(): keep state for deltas
        self.touched: dict[int, object] = {}      # streaming: seq_id -> sequence whose text may have grown

    def update(self, seq) -> str:
        """After a token was appended: extend seq.text; -> the text added."""
        if self.tokenizer is None:
            return ""
        st = self.states.setdefault(seq.seq_id, DetokState())
        delta, st.prefix_offset, st.read_offset = decode_increment(
            self.tokenizer.decode, seq.output_token_ids, st.prefix_offset, st.read_offset)
        seq.text += delta
        if self.streaming:
            self.touched[seq.seq_id] = seq
        return delta

    def finish(self, seq, flush: bool = True) -> None:
        """The sequence finished: emit what was held back (unless a stop string cut the text)."""
        st = self.states.get(seq.seq_id)
        if st is None:              # already finished and fully streamed
            return
        if flush and self.tokenizer is not None:
            seq.text += decode_remainder(self.tokenizer.decode, seq.output_token_ids, st.prefix_offset, st.read_offset)
            st.prefix_offset = st.read_offset = len(seq.output_token_ids)     # a second finish adds nothing
        if self.streaming:
            self.touched[seq.seq_id] = seq      # its last delta is taken by stream_step, which drops the state
        else:
            del self.states[seq.seq_id]

    def take_delta(self, seq, holdback: int = 0) -> str:
        """Text not yet streamed, keeping the last `holdback` characters back (a stop string may still
        match there and cut them) until the sequence finishes."""
        st = self.states.setdefault(seq.seq_id, DetokState())
        end = len(seq.text) if seq.is_finished else max(st.streamed, len(seq.text) - holdback)
        delta, st.streamed = seq.text[st.streamed:end], end
        if seq.is_finished:
            del self.states[seq.seq_id]
        return delta

    def take_touched(self) -> list:
        touched, self.touched = list(self.touched.values()), {}
        return touched
