"""Issue 23, items 9 and 14 (parts): what a plugin sends and what a client asks is bounded.

A plugin's frames, log lines and log volume per call are capped by the supervisor (the worker runs
the plugin's code, so its own cuts are a courtesy); the policy gateway refuses a request too large
for the context before tokenizing it; the console's Host check parses strictly; the API's OpenAPI
schema documents the errors its routes answer and the values its enum parameters accept.
"""

from __future__ import annotations

import gc
import http.client
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import psutil
import pytest
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from plugtune.demo import MODEL_DIR
from plugtune.errors import Cause, PluginCallError
from plugtune.gateway import JobSampling, PolicyGateway
from plugtune.gateway.serving import ThreadedServer
from plugtune.runtime import LocalRuntime
from plugtune.runtime.loglimit import MAX_CALL_CHARS, MAX_CALL_LINES, MAX_LINE_CHARS
from plugtune.runtime.protocol import MAX_FRAME
from plugtune.sdk import Policy, Runtime
from plugtune.store import Store
from plugtune.web import create_app
from tests.runtime.helpers import ctx, sample, trajectory
from tests.web.seed import seed

MiB = 1 << 20

# The channel is found as hostile code would find it: the root logger's handler holds it.
HOSTILE = """
import logging
import struct
import time

from plugtune import grader
from plugtune.runtime.protocol import LOG, pack


def _channel():
    return logging.getLogger().handlers[0].channel


def _raw_log(ctx, text):
    _channel().send_bytes(pack([LOG, time.time(), "INFO", text, "logger", ctx.call_id, ctx.trajectory_id]))


@grader
def warm(ctx, sample, trajectory):
    return 1.0


@grader
def huge_lines(ctx, sample, trajectory):
    line = "x" * (40 << 20)
    ctx.logger.info(line)
    print(line)
    return 1.0


@grader
def raw_flood(ctx, sample, trajectory):
    big = "y" * (20 << 20)
    _raw_log(ctx, big)
    _raw_log(ctx, big)
    for i in range(20_000):
        _raw_log(ctx, f"line {i}")
    return 1.0


@grader
def oversize_frame(ctx, sample, trajectory):
    _channel().send_bytes(struct.pack(">I", 100 << 20) + b"\\x00" * 4096)
    time.sleep(60)
    return 1.0
"""


@pytest.fixture
def hostile(tmp_path: Path) -> str:
    path = tmp_path / "hostile.py"
    path.write_text(HOSTILE)
    return str(path)


def _rss_mib() -> float:
    gc.collect()
    return float(psutil.Process().memory_info().rss / MiB)


@pytest.mark.timeout(60)
async def test_huge_log_lines_are_cut_and_the_supervisor_stays_small(hostile: str) -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{hostile}:huge_lines", runtime=Runtime(memory_mb=1024))
        await fn.invoke(ctx(), sample(), trajectory())  # warm: the runtime's own first-call costs
        before = _rss_mib()
        out = await fn.invoke(ctx(), sample(), trajectory())
        grown = _rss_mib() - before
        lines = [line for line in out.logs if line.message.startswith("xxx")]
        assert len(lines) == 2 and {line.source for line in lines} == {"logger", "stdout"}
        for line in lines:
            assert len(line.message) < MAX_LINE_CHARS + 100
            assert line.message.endswith(
                f"… [truncated {(40 << 20) - MAX_LINE_CHARS:,} characters: "
                f"a log line keeps at most {MAX_LINE_CHARS:,}]"
            )
        stored = sum(len(line.message) for line in fn.logs())
        assert stored < 5 * MAX_LINE_CHARS, stored  # two calls: what a job would store
        assert grown < 30, f"the supervisor grew {grown:.0f} MiB for 80 MiB of log lines"


@pytest.mark.timeout(60)
async def test_a_worker_that_skips_the_cuts_is_cut_and_counted_by_the_supervisor(hostile: str) -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{hostile}:raw_flood", runtime=Runtime(memory_mb=1024))
        out = await fn.invoke(ctx(), sample(), trajectory())
        assert out.value == 1.0
        big = [line for line in out.logs if line.message.startswith("yyy")]
        assert len(big) == 2 and all("… [truncated" in line.message for line in big)
        assert all(len(line.message) < MAX_LINE_CHARS + 100 for line in big)
        kept = [line for line in out.logs if line.message.startswith("line ")]
        assert len(kept) == MAX_CALL_LINES - 2
        (marker,) = [line for line in out.logs if line.source == "runtime"]
        dropped = 20_000 - len(kept)
        assert marker.message.startswith(f"[plugtune dropped {dropped:,} log lines (")
        assert f"at most {MAX_CALL_LINES:,} lines or {MAX_CALL_CHARS:,} characters" in marker.message
        assert marker.call_id == out.call_id and marker.trajectory_id == "traj-1"
        assert sum(len(line.message) for line in fn.logs()) < MAX_CALL_CHARS


@pytest.mark.timeout(60)
async def test_an_oversize_raw_frame_kills_the_instance_with_the_limit_named(hostile: str) -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{hostile}:oversize_frame", runtime=Runtime(timeout_s=40))
        before = _rss_mib()
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(), trajectory())
        assert info.value.cause == Cause.EOF.value
        message = str(info.value)
        assert f"a frame of {100 << 20:,} bytes is larger than the limit of {MAX_FRAME:,}" in message
        assert f"at most {MAX_FRAME >> 20} MiB" in message
        assert _rss_mib() - before < 30
        warm = await rt.deploy(f"{hostile}:warm")
        assert (await warm.invoke(ctx(), sample(), trajectory())).value == 1.0  # the supervisor serves on


# ---- the policy gateway: a request's size and context are checked before tokenizing ---------------


@pytest.fixture(scope="module")
def gateway() -> Iterator[PolicyGateway]:
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    with PolicyGateway(
        model, AutoTokenizer.from_pretrained(MODEL_DIR), sampling=JobSampling(1.0, 1.0, 8)
    ) as gw:
        yield gw


def _post_chat(policy: Policy, body: bytes) -> tuple[int, dict[str, Any]]:
    url = urlsplit(policy.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=20)  # bounds a hang
    try:
        headers = {"content-type": "application/json", "authorization": f"Bearer {policy.api_key}"}
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


@pytest.mark.timeout(60)
def test_a_9_mb_tools_list_is_refused_before_the_template_or_tokenizer_runs(gateway: PolicyGateway) -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 1000, "parameters": {}}}
    body = json.dumps(
        {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "tools": [tool] * 9000}
    ).encode()
    assert len(body) > 9_000_000
    renderer = gateway._service.renderer
    assert renderer._reuse_renders  # so every render and encoding is counted in its caches
    policy = gateway.open("tools-bomb")
    renders, encodings = len(renderer._rendered), len(renderer._encoded)
    status, answer = _post_chat(policy, body)
    assert status == 400, answer
    error = answer["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "tools")
    assert "characters at most for this tokenizer" in error["message"]
    assert (len(renderer._rendered), len(renderer._encoded)) == (renders, encodings)  # never reached
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "x" * 200_000}}]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": calls}]
    status, answer = _post_chat(policy, json.dumps({"model": "policy", "messages": messages}).encode())
    assert status == 400 and answer["error"]["param"] == "messages", answer
    assert (len(renderer._rendered), len(renderer._encoded)) == (renders, encodings)
    # Under the characters-per-token bound but over the context: its tokens are counted in pieces.
    long = [{"role": "user", "content": "hello " * 5000}]
    status, answer = _post_chat(policy, json.dumps({"model": "policy", "messages": long}).encode())
    assert status == 400 and "counted before rendering" in answer["error"]["message"], answer
    assert answer["error"]["code"] == "context_length_exceeded"
    assert (len(renderer._rendered), len(renderer._encoded)) == (renders, encodings)
    status, answer = _post_chat(policy, json.dumps({"model": "policy", "messages": messages[:1]}).encode())
    assert status == 200, answer  # the same key is served right after
    gateway.take("tools-bomb")


# ---- the console's Host check parses strictly ------------------------------------------------------


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[Store, int]]:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    server = ThreadedServer("test-console", "the console")
    port = server.start(create_app(store), "127.0.0.1", 0)
    try:
        yield store, port
    finally:
        server.stop()
        store.close()


def _raw_get(port: int, host_lines: list[bytes]) -> tuple[int, bytes]:
    """GET /api/jobs with exactly these Host header lines, over a real socket to uvicorn."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /api/jobs HTTP/1.1\r\n" + b"".join(h + b"\r\n" for h in host_lines) + b"\r\n")
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def _length(data: bytes) -> int:
    head = data.partition(b"\r\n\r\n")[0].lower()
    found = re.search(rb"content-length: *(\d+)", head)
    return int(found.group(1)) if found else 0


@pytest.mark.timeout(60)
def test_the_host_check_accepts_exactly_an_allowed_name_and_port(console: tuple[Store, int]) -> None:
    _, port = console
    for good in (f"127.0.0.1:{port}", "localhost", f"LOCALHOST.:{port}", f"[::1]:{port}", "[0:0::1]"):
        assert _raw_get(port, [f"Host: {good}".encode()])[0] == 200, good
    hostile = {
        "userinfo trick": [f"Host: 127.0.0.1:{port}@evil.example".encode()],
        "text after [v6]": [b"Host: [::1]evil"],
        "text after the port": [f"Host: 127.0.0.1:{port} evil.example".encode()],
        "a port out of range": [b"Host: 127.0.0.1:99999"],
        "two Host headers": [f"Host: 127.0.0.1:{port}".encode(), b"Host: evil.example"],
        "two Host headers, both fine": [f"Host: 127.0.0.1:{port}".encode(), b"Host: localhost"],
    }
    for case, lines in hostile.items():
        status, body = _raw_get(port, lines)
        assert status == 400, (case, status, body)
        assert b"Host" in body, (case, body)


def test_a_host_with_a_leading_space_is_refused(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    try:
        client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
        for value in (" 127.0.0.1", "127.0.0.1 ", "\t[::1]"):
            answer = client.get("/api/jobs", headers={"host": value})
            assert answer.status_code == 400 and "Host header" in answer.json()["detail"], value
        assert client.get("/api/jobs").status_code == 200
    finally:
        store.close()


# ---- the API's OpenAPI schema is what the API answers ----------------------------------------------

BAD_VALUES = ("bogus", "-1", "1e999", "x" * 300)


def test_every_route_documents_the_errors_it_can_answer_with_their_real_body(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    try:
        for token in (None, "secret-token"):
            schema = create_app(store, api_token=token).openapi()
            assert "HTTPValidationError" not in json.dumps(schema)
            for path, method, operation in _operations(schema):
                documented = set(operation["responses"])
                expected = {"400", "414", "503"} | ({"401"} if token else set())
                if method != "get":
                    expected |= {"403", "413", "415"}
                if "{" in path:
                    expected.add("404")
                if operation.get("parameters"):
                    expected.add("422")
                assert expected <= documented, (method, path, expected - documented)
    finally:
        store.close()


def test_what_the_api_answers_to_invalid_requests_matches_its_schema(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    try:
        seeded = seed(store)
        client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
        schema = client.app.openapi()  # type: ignore[attr-defined]
        job = seeded.failed_job
        plugin = store.list_plugins(job)[0].name
        valid = {"job_id": str(job), "name": plugin, "trajectory_id": seeded.failed_trajectory}
        valid |= {"group_id": "s2-g1", "path": "grader.py"}
        seen: set[int] = set()
        for path, method, operation in _operations(schema):
            streams = "text/event-stream" in json.dumps(operation["responses"].get("200", {}))
            fill = {**valid, "job_id": "999999"} if method != "get" or streams else valid
            for probe in _probes(method, path, operation, fill):
                answer = client.request(method.upper(), **probe)
                _check(schema, method, path, operation, answer)
                seen.add(answer.status_code)
            if path.endswith("/retry") or method == "delete":  # a running job: 409 (cancel would signal it)
                answer = client.request(method.upper(), _url(path, {"job_id": str(seeded.running_job)}))
                _check(schema, method, path, operation, answer)
                seen.add(answer.status_code)
            for name, values in _enums(operation):
                for value in values:
                    also = {"start": "1", "end": "2"} if value == "custom" else {}  # as its description says
                    answer = client.request(method.upper(), _url(path, fill), params={name: value, **also})
                    assert answer.status_code < 400 or answer.status_code in (404, 409), (path, name, value)
                    assert answer.status_code not in (400, 422), (path, name, value, answer.text)
        assert {200, 400, 403, 404, 409, 414, 415, 422} <= seen, seen
    finally:
        store.close()


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def _url(path: str, fill: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)(:path)?\}", lambda m: fill[m.group(1)], path)


def _probes(
    method: str, path: str, operation: dict[str, Any], fill: dict[str, str]
) -> Iterator[dict[str, Any]]:
    """A handful of invalid requests: each path and query parameter wrong, a long query, a bad Host,
    a write with the wrong Content-Type or from another origin."""
    url = _url(path, fill)
    yield {"url": url}
    for param in operation.get("parameters", []):
        if param["in"] == "path":
            for bad in ("0", "x", "9" * 30):
                yield {"url": _url(path, {**fill, param["name"]: bad})}
        else:
            for bad in BAD_VALUES:
                yield {"url": url, "params": {param["name"]: bad}}
    yield {"url": url, "params": {"q": "x" * 9000}}
    yield {"url": url, "headers": {"host": "evil.example"}}
    if method != "get":
        yield {"url": url, "headers": {"content-type": "text/plain"}, "content": b"x"}
        yield {"url": url, "headers": {"origin": "http://evil.example"}}


def _enums(operation: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    for param in operation.get("parameters", []):
        if param["in"] == "query" and "enum" in param["schema"]:
            yield param["name"], param["schema"]["enum"]


def _check(schema: dict[str, Any], method: str, path: str, operation: dict[str, Any], answer: Any) -> None:
    code = str(answer.status_code)
    assert code in operation["responses"], (method, path, code, answer.text[:300])
    content = operation["responses"][code].get("content", {}).get("application/json")
    if content is None or not answer.headers.get("content-type", "").startswith("application/json"):
        return
    validator = jsonschema.Draft202012Validator({**content["schema"], "components": schema["components"]})
    errors = [e.message for e in validator.iter_errors(answer.json())]
    assert not errors, (method, path, code, errors[:3], answer.text[:300])


@pytest.mark.timeout(60)
async def test_an_oversize_frame_at_import_time_fails_the_deploy_with_the_limit_named(tmp_path: Path) -> None:
    path = tmp_path / "import_bomb.py"
    path.write_text(
        "import gc\nimport struct\n\nfrom plugtune import grader\n\n"
        "for obj in gc.get_objects():\n"
        "    if type(obj).__name__ == 'Channel':\n"
        "        obj.send_bytes(struct.pack('>I', 100 << 20))\n\n\n"
        "@grader\ndef score(ctx, sample, trajectory):\n    return 1.0\n"
    )
    async with LocalRuntime() as rt:
        with pytest.raises(PluginCallError, match=f"larger than the limit of {MAX_FRAME:,}") as info:
            await rt.deploy(f"{path}:score")
        assert info.value.cause == Cause.CREATE_FAULT.value
