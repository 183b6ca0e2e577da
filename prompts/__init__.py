"""The prompts and report templates (prompts/*.j2) and the one jinja environment that renders them.

StrictUndefined everywhere (STYLE §6): a missing variable fails loudly. LLM prompts and comments
render as written (`render`); documents whose block tags sit on their own lines, such as
report.md.j2, render with those lines trimmed (`render_document`).
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

FOLDER = Path(__file__).resolve().parent
ENVIRONMENT = Environment(loader=FileSystemLoader(FOLDER), undefined=StrictUndefined, keep_trailing_newline=True)
DOCUMENTS = ENVIRONMENT.overlay(trim_blocks=True, lstrip_blocks=True)


def render(template: str, **ctx) -> str:
    """A prompt or comment template, whitespace as written."""
    return ENVIRONMENT.get_template(template).render(**ctx)


def render_document(template: str, **ctx) -> str:
    """A document template, block-tag lines trimmed."""
    return DOCUMENTS.get_template(template).render(**ctx)
