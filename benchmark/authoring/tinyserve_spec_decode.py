"""tinyserve cases: speculative decoding and KV rollback (spec-decode)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.tinyserve_history import (
    ANYA,
    ENGINE,
    NADIA_RAHMAN,
    PROPOSERS,
    RAFAEL_COSTA,
    REJECTION,
    SPEC,
    SUBJECT,
    TARIQ,
    dated_steps,
    tinyserve_repro,
)


def case_spec_rollback_partial_block() -> CaseSpec:
    bug = [
        (
            SPEC,
            '''    """Give back the blocks past the first `num_tokens` tokens (they held rejected drafts only)."""
    keep = -(-num_tokens // block_manager.block_size)
''',
            '''    """Give back the blocks past the first `num_tokens` tokens (they held rejected drafts only)."""
    keep = num_tokens // block_manager.block_size       # whole blocks of accepted tokens stay
''',
        )
    ]
    history = dated_steps(
        [
            (
                "2025-05-06T09:12:40+00:00",
                ANYA,
                "spec_decode: acceptance-rate statistic",
                [
                    (
                        SPEC,
                        "    def step(self) -> list[RequestOutput]:\n",
                        "    @property\n    def acceptance_rate(self) -> float:\n"
                        "        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0\n\n"
                        "    def step(self) -> list[RequestOutput]:\n",
                    )
                ],
            ),
            (
                "2025-05-08T15:31:02+02:00",
                TARIQ,
                "proposers: note why n-gram proposals need no probabilities",
                [
                    (
                        PROPOSERS,
                        "class NgramProposer:\n",
                        'class NgramProposer:\n    """Prompt lookup: proposals are copied context, a point mass for the rejection sampler."""\n\n',
                    )
                ],
            ),
            (
                "2025-05-12T11:20:13+00:00",
                ANYA,
                "spec_decode: free whole blocks of rejected drafts on rollback\n\nOnly blocks past the accepted tokens go "
                "back to the pool; simpler bound than before.",
                bug,
            ),
            (
                "2025-05-14T18:03:55+02:00",
                NADIA_RAHMAN,
                "spec_decode: explain the draft budget caps",
                [
                    (
                        SPEC,
                        "        if seq.forced_token_ids is not None or seq.num_uncomputed_tokens != 1:\n",
                        "        # teacher-forced sequences and unfinished prefills verify nothing\n"
                        "        if seq.forced_token_ids is not None or seq.num_uncomputed_tokens != 1:\n",
                    )
                ],
            ),
            (
                "2025-05-19T10:47:26+00:00",
                RAFAEL_COSTA,
                "rejection: name the residual distribution in a comment",
                [
                    (
                        REJECTION,
                        "    residual = probs.clone()\n",
                        "    # the residual max(p - q, 0) with q a point mass at the draft: p without the draft\n"
                        "    residual = probs.clone()\n",
                    )
                ],
            ),
            (
                "2025-05-21T13:09:38+02:00",
                NADIA_RAHMAN,
                "engine: abort_request",
                [
                    (
                        ENGINE,
                        "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n",
                        "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n\n"
                        "    def abort_request(self, request_id: str) -> bool:\n"
                        '        """Finish a running request now (its blocks go back to the pool); -> whether it was running."""\n'
                        "        for seq in list(self.scheduler.running):\n"
                        "            if seq.request_id == request_id:\n"
                        '                self.scheduler.finish(seq, "abort")\n'
                        "                return True\n"
                        "        return False\n",
                    )
                ],
            ),
            (
                "2025-05-26T09:58:11+00:00",
                TARIQ,
                "spec_decode: docstring for verification_rows' ordering",
                [
                    (
                        SPEC,
                        '    sequence. -> (rows, scheduled-sequence index per row, draft verified per row or -1)."""\n',
                        '    sequence, in batch order. -> (rows, scheduled-sequence index per row, draft verified per row or -1)."""\n',
                    )
                ],
            ),
        ]
    )
    loop = [104, 23, 87, 311, 56, 9]
    reqs = [
        {"prompt_ids": loop * 4 + [104, 23], "max_tokens": 16, "sampling": {"temperature": 0.0, "ignore_eos": True}},
        {
            "prompt_ids": [200, 31, 200, 31, 200, 31, 7, 200],
            "max_tokens": 12,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
    ]
    return CaseSpec(
        subject=SUBJECT,
        id="ts-spec-rollback-partial-block",
        issue_number=1402,
        category="spec-decode",
        modeled_on=["sgl-project/sglang#24175", "vllm-project/vllm#36580"],
        title="Greedy output changes when n-gram speculative decoding is on",
        issue=issue_text("ts-spec-rollback-partial-block"),
        repro=tinyserve_repro(
            "llama", "float32", {"speculative": "ngram", "num_speculative_tokens": 3, "block_size": 4}, reqs
        ),
        truth_file=SPEC,
        truth_function="free_tail_blocks",
        component="kv-cache",
        mechanism="rollback after a rejected draft keeps floor(num_tokens / block_size) blocks, freeing the "
        "partly filled block that still holds accepted tokens' KV",
        steps=history,
        bug_index=3,
    )


CASES = [
    case_spec_rollback_partial_block(),
]
