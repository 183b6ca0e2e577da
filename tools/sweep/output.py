"""The sweep's results for CI: JUnit XML (one test case per cell) and a Markdown summary."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tools.sweep.group import CellResult, Group


def junit_xml(results: list[CellResult], suite: str, engine: str) -> str:
    """JUnit XML: a divergent cell is a <failure>, an engine that crashed an <error>, a cell the
    time budget left out <skipped>; the message is the probe's one-line verdict."""
    counts = {s: sum(r.status == s for r in results) for s in ("diverge", "error", "skipped")}
    total = sum(r.seconds for r in results)
    root = ET.Element("testsuites", name=suite, tests=str(len(results)), time=f"{total:.3f}")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(counts["diverge"]),
        errors=str(counts["error"]),
        skipped=str(counts["skipped"]),
        time=f"{total:.3f}",
    )
    for r in results:
        case = ET.SubElement(
            ts, "testcase", classname=f"diffdx.check.{engine}", name=r.cell.id, time=f"{r.seconds:.3f}"
        )
        if r.status == "diverge":
            ET.SubElement(case, "failure", message=r.summary, type="divergence").text = r.detail or r.summary
        elif r.status == "error":
            ET.SubElement(case, "error", message=r.summary, type="engine").text = r.detail or r.summary
        elif r.status == "skipped":
            ET.SubElement(case, "skipped", message=r.summary)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def markdown_summary(
    results: list[CellResult],
    groups: list[Group],
    minimized: dict[str, dict],
    engine: str,
    wall_s: float,
    left_out: list[str] | None = None,
) -> str:
    """What ran, what diverged (by group, with the minimal scenario and the diagnosis), what was
    skipped and why, and what the matrix left out because the engine does not run it."""
    n = {s: sum(r.status == s for r in results) for s in ("agree", "diverge", "error", "skipped")}
    lines = [
        f"# diffdx check: {engine}",
        "",
        f"{len(results)} cells: {n['agree']} agree, {n['diverge']} diverge, {n['error']} errored, "
        f"{n['skipped']} not run; {wall_s:.0f} s.",
        "",
    ]
    if groups:
        lines += ["## Divergences", ""]
    for g in groups:
        info = minimized.get(g.id, {})
        rep = g.representative()
        lines += [
            f"### {g.id}",
            "",
            f"- first divergent tap: `{g.key[0]}`; feature set `{g.key[1]}`; workloads " + ", ".join(g.workloads),
            f"- {len(g.cells)} cells: " + ", ".join(f"`{r.cell.id}`" for r in g.cells),
            f"- representative `{rep.cell.id}`: {rep.summary}",
        ]
        if info.get("steps") is not None:
            lines.append(f"- minimized in {info['probes']} probes: " + ("; ".join(info["steps"]) or "already minimal"))
        if info.get("scenario"):
            lines.append(f"- minimal scenario: `{info['scenario']}`")
        if info.get("plot"):
            lines.append(f"- ![divergence]({info['plot']})")
        top = info.get("top")
        if top:
            lines.append(
                f"- diagnosis: `{top['file']}` `{top['function']}`" + (" (verified)" if top.get("verified") else "")
            )
            lines.append(f"  report: `{info['report']}`")
        elif info.get("diagnosis_note"):
            lines.append(f"- diagnosis: {info['diagnosis_note']}")
        lines.append("")
    errors = [r for r in results if r.status == "error"]
    if errors:
        lines += ["## Errored cells", ""] + [f"- `{r.cell.id}`: {r.summary}" for r in errors] + [""]
    skipped = [r for r in results if r.status == "skipped"]
    if skipped:
        lines += [
            "## Not run",
            "",
            f"{skipped[0].summary}. The cells run were chosen to cover every axis value, then every pair "
            "of values, first.",
            "",
            ", ".join(f"`{r.cell.id}`" for r in skipped),
            "",
        ]
    if left_out:
        lines += ["## Left out of the matrix", "", f"Not what {engine} runs (its adapter says so):", ""]
        lines += [f"- {reason}" for reason in left_out] + [""]
    return "\n".join(lines)
