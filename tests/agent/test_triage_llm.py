"""LLM-assisted triage against a scripted model that speaks the OpenAI protocol over HTTP."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.triage import Reader
from agent.triage_llm import OpenAITriageLLM, merge_extraction, parse_label


class ScriptedModel:
    """Answers /v1/chat/completions with the next scripted reply."""

    def __init__(self, replies):
        self.replies, self.prompts = list(replies), []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.prompts.append(req["messages"][-1]["content"])
                text = fake.replies.pop(0)
                data = json.dumps(
                    {
                        "id": "c1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": req["model"],
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture
def model(monkeypatch):
    def start(*replies):
        m = ScriptedModel(replies)
        monkeypatch.setenv("OPENAI_BASE_URL", m.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        return m

    yield start


def test_llm_label_overrides_rules_and_bad_answers_fall_back(model):
    m = model('```json\n{"label": "silent", "confidence": 0.8}\n```', "I think it is a crash")
    reader = Reader(OpenAITriageLLM("scripted"))
    assert reader.classify("Answers got worse", "since last week")["label"] == "silent"
    fallback = reader.classify("[Feature]: support for Jamba", "would be nice")
    assert fallback["label"] == "feature" and "source" not in fallback
    assert "Title: Answers got worse" in m.prompts[0]


def test_llm_fills_what_the_rules_missed(model):
    model(
        json.dumps(
            {
                "model": {"path": "Qwen/Qwen2-7B-Instruct", "arch": "qwen2"},
                "workload": {"requests": [{"prompt": "Say hi", "max_tokens": 8}]},
            }
        )
    )
    partial, _ = Reader(OpenAITriageLLM("scripted")).extract(
        "wrong output", "with vllm 0.5.4 and the qwen 7b chat model"
    )
    assert partial["model"]["path"] == "Qwen/Qwen2-7B-Instruct"
    assert partial["workload"]["requests"] == [{"prompt": "Say hi", "max_tokens": 8}]
    assert partial["target"]["engine"] == "vllm"  # the rules' value is kept


def test_parsing_is_strict():
    assert parse_label('{"label": "silent", "confidence": 3}') == ("silent", 1.0)
    assert parse_label('{"label": "bug"}') is None and parse_label("no json") is None
    assert merge_extraction({"model": {"arch": "llama"}}, None) == {"model": {"arch": "llama"}}
