"""A lookup by conversation id with the wrong identity, or none, says so (IdentityHint,
docs/jobs.md, "Identity and lookups by conversation id"): load_conversation returning None and
cancel_conversation returning 0 while the turns live under another namespace. Never with the
identity's values in the message; never when the namespace looked in is in use. Real workers,
a real Redis."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tasks import TurnState, load_conversation, run_turn, turn_status
from tasks.core.errors import TurnCancelled
from tasks.core.namespaces import IdentityHint, broader_identities, describe_identity
from tasks.operate.control import cancel_conversation
from tasks.testing import wait_until

pytestmark = pytest.mark.integration

ACME_U7 = {"tenant": "acme", "principal": "u-7"}


@contextmanager
def no_hint() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdentityHint)
        yield


def hint(record: pytest.WarningsRecorder) -> str:
    """The one IdentityHint warned, which points at the caller's line and names no identity
    value."""
    hints = [w for w in record.list if issubclass(w.category, IdentityHint)]
    assert len(hints) == 1, [str(w.message) for w in hints]
    assert hints[0].filename == __file__, "stacklevel: the warning names the caller's line"
    text = str(hints[0].message)
    assert "acme" not in text and "u-7" not in text, text
    return text


def test_broader_identities_and_their_description() -> None:
    assert broader_identities(None) == [] and broader_identities({}) == []
    assert broader_identities({"tenant": "a", "principal": ""}) == [{}]
    assert broader_identities({"principal": "p"}) == [{}]
    assert broader_identities({"tenant": "a", "principal": "p"}) == [
        {"tenant": "a"},
        {"principal": "p"},
        {},
    ]
    assert describe_identity(None) == "no tenant and no principal"
    assert describe_identity({"tenant": "a", "principal": "p"}) == "tenant and principal"
    assert describe_identity({"principal": "p"}) == "principal only"


def test_loading_without_the_identity_a_turn_was_submitted_with_warns(jobs: Any) -> None:
    run_turn.delay(agent="demo", conversation_id="c-42", message="hello", identity=ACME_U7).get(
        timeout=20
    )
    with no_hint():
        assert load_conversation("c-42", ACME_U7) is not None
    # Without the identity: the default namespace was used, and the warning says so
    with pytest.warns(IdentityHint) as record:
        assert load_conversation("c-42") is None
    text = hint(record)
    assert text.startswith("load_conversation('c-42') found nothing in the default namespace")
    assert "'_/_/c-42'" in text and "pass the identity run_turn was given" in text
    # Another principal of the tenant: nothing under the identities it narrows, no warning
    with no_hint():
        assert load_conversation("c-42", {"tenant": "acme", "principal": "u-8"}) is None


def test_loading_with_more_identity_than_the_turn_had_names_where_it_is(jobs: Any) -> None:
    run_turn.delay(
        agent="demo", conversation_id="c-t", message="hi", identity={"tenant": "acme"}
    ).get(timeout=20)
    with pytest.warns(IdentityHint) as record:
        assert load_conversation("c-t", ACME_U7) is None
    text = hint(record)
    assert "under the identity it was given (tenant and principal)" in text
    assert "has a stored conversation under an identity with tenant only" in text


def test_a_conversation_still_in_its_first_turn_is_no_reason_to_warn(make_jobs: Any) -> None:
    make_jobs()  # no worker: the turn stays queued, nothing is stored yet
    run_turn.delay(agent="demo", conversation_id="c-q", message="waits")
    with no_hint():
        assert load_conversation("c-q") is None


def test_cancelling_without_the_identity_warns_while_the_turn_runs_on(make_jobs: Any) -> None:
    jobs = make_jobs()
    worker = jobs.worker()
    identity = {"tenant": "acme"}
    result = run_turn.delay(
        agent="demo", conversation_id="c-cc", message="work rounds:1 slow:2", identity=identity
    )
    wait_until(
        lambda: (status := turn_status(result.id)) and status.state is TurnState.RUNNING,
        15,
        "the turn to run",
    )
    with pytest.warns(IdentityHint) as record:
        assert cancel_conversation("c-cc") == 0
    assert "cancel_conversation('c-cc') found nothing in the default namespace" in hint(record)
    with pytest.warns(IdentityHint) as record:
        assert cancel_conversation("c-cc", ACME_U7) == 0
    assert "has unfinished turns under an identity with tenant only" in hint(record)
    status = turn_status(result.id)
    assert status is not None and status.state is TurnState.RUNNING, "it ran on"
    # With the identity it was submitted with: cancelled, and no hint
    with no_hint():
        assert cancel_conversation("c-cc", identity) == 1
    with pytest.raises(TurnCancelled):
        result.get(timeout=10)
    # Nothing left to cancel, nothing under the identities it narrows: no hint
    with no_hint():
        assert cancel_conversation("c-cc", identity) == 0
    worker.stop()


def test_cancelling_with_an_identity_finds_turns_submitted_without_one(make_jobs: Any) -> None:
    make_jobs()  # no worker: the turn stays queued
    run_turn.delay(agent="demo", conversation_id="c-d", message="queued")
    with pytest.warns(IdentityHint) as record:
        assert cancel_conversation("c-d", {"principal": "u-7"}) == 0
    text = hint(record)
    assert "(principal only)" in text
    assert "under an identity with no tenant and no principal (the default namespace" in text
    with no_hint():
        assert cancel_conversation("c-d") == 1
