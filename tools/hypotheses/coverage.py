"""Function coverage as evidence: which functions the failing run ran, per language.

The recorders (tools/engines/funccov.py) see Python frames only. On a tree that mixes Python with
C/C++, a native function is missing from the record whether it ran or not, so its coverage is
unknown: it is neither "ran" nor "not run" (dropping it, or pushing it down as never run, would
hide a native bug behind the Python around it). The worker names the languages it recorded
(`coverage_languages` in the trace meta); a record without that key is Python's.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.source.index import language_of

RAN = "runs in the failing scenario"  # evidence lines, read back by the release-diff localizer
UNRECORDED = "whether it ran is unknown: function coverage does not record its language"  # evidence line


@dataclass(frozen=True)
class Coverage:
    functions: frozenset[str]  # 'file:qualname' of every recorded function that ran
    languages: frozenset[str] = frozenset({"python"})  # the languages the record covers

    @classmethod
    def from_meta(cls, meta: dict) -> Coverage | None:
        """A trace's record, or None where none was taken (an engine failure, a native-only tree)."""
        if "coverage" not in meta:
            return None
        return cls(frozenset(meta["coverage"]), frozenset(meta.get("coverage_languages", ["python"])))

    def knows(self, file: str) -> bool:
        """Whether the record would hold a function of `file` that ran."""
        return language_of(file) in self.languages

    def __contains__(self, key: object) -> bool:
        return key in self.functions


def ran(coverage: Coverage | None, file: str, qualname: str) -> bool | None:
    """True: it ran; False: it did not; None: unknown (no record, or a language it does not cover)."""
    if coverage is None or not coverage.knows(file):
        return None
    return f"{file}:{qualname}" in coverage
