"""`agentjobs metrics` as a process, scraped over HTTP after a known mix of turns: the figures
come from the state store (counters kept in Redis, so they outlive the processes), a scrape
without Redis says so in `agentjobs_up`, and a port in use is one line."""

from __future__ import annotations

import contextlib
import gc
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tasks import TurnDeadLettered, cancel_turn, run_turn, turn_status
from tasks.operate.metrics import REQUEST_TIMEOUT_S
from tasks.queue.context import job_context
from tasks.store.records import TurnState
from tasks.testing import READY, Process, free_port, start_process, wait_until

AGENTJOBS = str(Path(sys.executable).parent / "agentjobs")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def start_metrics(jobs: Any, env: dict[str, str] | None = None) -> tuple[Process, int]:
    port = free_port()
    command = [AGENTJOBS, "metrics", "--port", str(port), "--host", "127.0.0.1"]
    process = start_process(
        "metrics", command, {**jobs.env, **(env or {})}, jobs.logdir, ready=READY["metrics"]
    )
    jobs.processes.append(process)
    return process, port


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture(autouse=True)
def _collect_results() -> Iterator[None]:
    """A test that caught a result's exception keeps its frame, and so its AsyncResults, in a
    reference cycle (exception, traceback, frame). Collected after the session's Redis stopped,
    they fail to unsubscribe from it (and Python 3.11 may then fail to compile a module): collect
    them while it runs."""
    yield
    gc.collect()


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_the_figures_of_a_known_mix_of_turns_add_up_and_outlive_the_processes(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(AGENTJOBS_MAX_ATTEMPTS="2")
    jobs.worker()
    jobs.pump()
    metrics, port = start_metrics(jobs)
    # Given two turns that succeed, one that succeeds after a retry, one that spends both its
    # attempts, one that is not resumable, and one cancelled while it runs
    done = [
        run_turn.delay(agent="demo", conversation_id=f"c-ok{n}", message="hi") for n in range(2)
    ]
    done.append(run_turn.delay(agent="demo", conversation_id="c-retry", message="x fail:503x1"))
    failing = [
        run_turn.delay(agent="demo", conversation_id="c-spent", message="y fail:503x2"),
        run_turn.delay(agent="demo", conversation_id="c-401", message="z fail:401"),
    ]
    slow = run_turn.delay(agent="demo", conversation_id="c-cancel", message="w rounds:1 slow:3")
    for result in done:
        result.get(timeout=30)
    for result in failing:
        with pytest.raises(TurnDeadLettered):
            result.get(timeout=30)
    wait_until(lambda: _state(slow.id) is TurnState.RUNNING, 10, "the slow turn to run")
    assert cancel_turn(slow.id, reason="test")
    # When Prometheus scrapes the metrics command
    samples = scrape(port)
    # Then it counts every turn that ended, by outcome, and every retry
    assert value(samples, "agentjobs_up") == 1
    assert value(samples, "agentjobs_turns_submitted_total") == 6
    finished = {
        outcome: value(samples, "agentjobs_turns_finished_total", outcome=outcome)
        for outcome in ("succeeded", "dead_lettered", "cancelled")
    }
    assert finished == {"succeeded": 3, "dead_lettered": 2, "cancelled": 1}
    assert value(samples, "agentjobs_retries_scheduled_total") == 2
    assert value(samples, "agentjobs_lease_takeovers_total") == 0
    for reason in ("max_attempts", "non_resumable"):
        assert value(samples, "agentjobs_dead_letters", reason=reason) == 1
        assert value(samples, "agentjobs_turns_dead_lettered_total", reason=reason) == 1
    assert value(samples, "agentjobs_dead_letters", reason="poison") == 0
    # and nothing is left to run
    for state in ("queued", "running", "waiting"):
        assert value(samples, "agentjobs_turns", state=state) == 0
    assert value(samples, "agentjobs_oldest_runnable_age_seconds") == 0
    assert value(samples, "agentjobs_retries_due") == 0
    assert value(samples, "agentjobs_workers", state="alive") == 1
    assert value(samples, "agentjobs_pump_last_tick_age_seconds") < 2

    # When the workers, the pump and the metrics command stop, and a turn is submitted
    jobs.stop_all()
    queued = run_turn.delay(agent="demo", conversation_id="c-later", message="later")
    run_turn.delay(agent="demo", conversation_id="c-later", message="behind it")
    time.sleep(1.0)
    _, port = start_metrics(jobs)
    samples = scrape(port)
    # Then a new metrics command finds the same counts in Redis
    assert value(samples, "agentjobs_turns_finished_total", outcome="succeeded") == 3
    assert value(samples, "agentjobs_retries_scheduled_total") == 2
    assert value(samples, "agentjobs_turns_submitted_total") == 8
    # and sees the queued turns, the oldest runnable one waiting since its submission, and no
    # worker or pump alive
    assert value(samples, "agentjobs_turns", state="queued") == 2
    assert value(samples, "agentjobs_oldest_runnable_age_seconds") >= 1.0
    assert value(samples, "agentjobs_workers", state="alive") == 0
    assert value(samples, "agentjobs_pump_last_tick_age_seconds") >= 1.0
    assert _state(queued.id) is TurnState.QUEUED
    assert metrics.alive() is False


def _state(turn_id: str) -> TurnState | None:
    status = turn_status(turn_id)
    return status.state if status is not None else None


def test_a_lease_takeover_is_counted_once(make_jobs: Any) -> None:
    jobs = make_jobs()
    records = job_context().records
    # Given a running turn whose worker stopped renewing its lease
    records.register("t-take", payload=b"{}", agent="a", conversation_id="c", namespace="ns")
    assert records.claim("t-take", "ns", "token-1", 0.05, "w1").record is not None
    time.sleep(0.1)
    # When another delivery claims it
    assert records.claim("t-take", "ns", "token-2", 5, "w2").record is not None
    # Then the metrics count one takeover
    _, port = start_metrics(jobs)
    assert value(scrape(port), "agentjobs_lease_takeovers_total") == 1


def test_a_scrape_without_redis_says_so_and_the_command_keeps_serving(make_jobs: Any) -> None:
    jobs = make_jobs()
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    metrics, port = start_metrics(jobs, env={"REDIS_URL": nowhere})
    for _ in range(2):
        samples = scrape(port)
        assert samples == {("agentjobs_up", ()): 0}
    log = metrics.log()
    assert log.count("metrics: cannot read Redis") == 1, log
    assert "Traceback" not in log
    assert metrics.alive()


def test_a_port_in_use_is_one_line(make_jobs: Any) -> None:
    jobs = make_jobs()
    _, port = start_metrics(jobs)
    done = subprocess.run(
        [AGENTJOBS, "metrics", "--port", str(port), "--host", "127.0.0.1"],
        env=jobs.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"agentjobs: cannot serve metrics on 127.0.0.1:{port} (Address already in use)"
    ), done.stderr


def _listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


def test_the_metrics_command_listens_on_loopback_unless_told_otherwise(make_jobs: Any) -> None:
    jobs = make_jobs()
    port = free_port()
    command = [AGENTJOBS, "metrics", "--port", str(port)]
    metrics = start_process("metrics", command, jobs.env, jobs.logdir, ready=READY["metrics"])
    jobs.processes.append(metrics)
    assert _listening(port) == ["0100007F"], _listening(port)  # 127.0.0.1 only
    assert f"serving metrics on 127.0.0.1:{port}" in metrics.log()
    assert value(scrape(port), "agentjobs_up") == 1


def _threads(process: Process) -> int:
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_idle_and_half_sent_connections_are_closed_and_scrapes_go_on(make_jobs: Any) -> None:
    jobs = make_jobs()
    metrics, port = start_metrics(jobs)
    idle_threads = _threads(metrics)
    # Given many connections that sent half a request, and as many that sent nothing
    held = []
    for n in range(300):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if n % 2 == 0:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n")
        held.append(sock)
    started = time.monotonic()
    # Then the command still answers a scrape meanwhile
    assert value(scrape(port), "agentjobs_up") == 1
    # and closes every one of them within its request timeout
    for sock in held:
        sock.settimeout(max(0.1, REQUEST_TIMEOUT_S + 3 - (time.monotonic() - started)))
        with contextlib.suppress(ConnectionResetError):  # closed with the request unread
            assert sock.recv(1024) == b""
        sock.close()
    assert time.monotonic() - started < REQUEST_TIMEOUT_S + 3
    wait_until(lambda: _threads(metrics) <= idle_threads + 1, 5, "the connection threads to end")
    assert "Traceback" not in metrics.log() and metrics.alive()
