"""Trackers read back: TensorBoard event files, an offline W&B run, and the OTLP spans of plugin calls
as a collector on 127.0.0.1 receives them."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from plugtune import grader
from plugtune.errors import PluginCallError
from plugtune.jobs.caller import PolicyCaller
from plugtune.sdk import Context
from plugtune.spec.models import FailurePolicy
from plugtune.trainer.testing import InProcessFunction
from plugtune.trainer.tracking import TENSORBOARD_DIR, WANDB_DIR, CallSpans, Trackers


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``folder``, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_history(job_dir: Path) -> list[dict[str, str]]:
    """The logged rows of the offline W&B run under ``job_dir`` (its .wandb file: a LevelDB-style
    log of protobuf records, read here without wandb's own reader, which 0.31 no longer ships)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (job_dir / WANDB_DIR).glob("offline-run-*/run-*.wandb")
    data, pos, block, pending, rows = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind not in (1, 4):  # first or middle piece of a record
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        if record.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): i.value_json for i in record.history.item})
    return rows


class Collector:
    """A tiny OTLP/HTTP receiver: keeps the spans of every POST to /v1/traces."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans: list[dict[str, Any]] = []
        self.spans, self.paths = spans, []
        paths = self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                paths.append(self.path)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    job = {a.key: a.value.string_value for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            attrs = {a.key: _value(a.value) for a in span.attributes}
                            duration_ms = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
                            spans.append({**attrs, "name": span.name, "ms": duration_ms, **job})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def test_every_step_is_in_tensorboard_event_files_and_an_offline_wandb_run(tmp_path: Path) -> None:
    with Trackers(tmp_path, "job-1", wandb_project="plugtune-test", config={"learning_rate": 0.1}) as t:
        t.log(1, {"reward/mean": 0.25, "loss": float("nan")})
        t.log(2, {"reward/mean": 0.75, "loss": -0.5})
    scalars = tensorboard_scalars(tmp_path / TENSORBOARD_DIR)
    assert scalars["reward/mean"] == [(1, 0.25), (2, 0.75)]
    assert scalars["loss"] == [(2, -0.5)]  # a NaN is left out, as in the store
    rows = wandb_history(tmp_path)
    assert [(r["_step"], r["reward/mean"]) for r in rows] == [("1", "0.25"), ("2", "0.75")]
    assert "loss" not in rows[0]


@grader
def half(ctx: Any, sample: Any, trajectory: Any) -> float:
    return 0.5


@grader
def broken(ctx: Any, sample: Any, trajectory: Any) -> float:
    raise RuntimeError("no answer field")


async def test_every_plugin_call_is_a_span_at_the_otlp_collector(collector: Collector) -> None:
    spans = CallSpans(collector.endpoint, job_id="7")
    caller = PolicyCaller(FailurePolicy(max_attempts=2, on_exhausted="drop_sample"), spans)
    ctx = Context(job_id="7", step=3, trajectory_id="t-ok")
    await caller(InProcessFunction(half), ctx, None, None)
    with pytest.raises(PluginCallError):
        await caller(
            InProcessFunction(broken), Context(job_id="7", step=3, trajectory_id="t-bad"), None, None
        )
    spans.close()  # exports what is left, over HTTP

    assert set(collector.paths) == {"/v1/traces"}
    by_plugin = {(s["plugtune.plugin"], s["plugtune.attempt"]): s for s in collector.spans}
    assert by_plugin.keys() == {("half", 1), ("broken", 1), ("broken", 2)}  # the retry is a call too
    ok = by_plugin["half", 1]
    assert ok["plugtune.status"] == "success" and ok["plugtune.cause"] == ""
    assert ok["plugtune.trajectory_id"] == "t-ok" and ok["plugtune.step"] == 3
    assert ok["plugtune.job_id"] == "7" and ok["name"] == "plugin half"
    assert ok["plugtune.latency_ms"] == pytest.approx(ok["ms"], abs=0.01)
    bad = by_plugin["broken", 2]
    assert bad["plugtune.status"] == "error" and bad["plugtune.cause"] == "500"
    assert bad["plugtune.trajectory_id"] == "t-bad"


def test_without_a_collector_calls_make_no_spans() -> None:
    spans = CallSpans()
    assert not spans.is_on
    spans.record("half", Context(), 0, status="success")  # nothing to export to, nothing kept
    spans.close()
