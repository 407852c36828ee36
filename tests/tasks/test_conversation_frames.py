"""The stored conversation as an envelope and conversation frames (tasks/store/conversations.py):
a turn's end appends one frame against the conversation it started from, or writes the whole
envelope again once the frames would outweigh it (or reach the cap); read back, envelope and
frames are the very checkpoint the last turn ended with, byte for byte. An envelope written
whole by something that knows nothing of frames wins over the frames left from before it.
Pure checks first, then property tests (in memory, and through the Lua scripts on a real
Redis), then real workers: a conversation of 40 turns with tool rounds, a cancelled and a
deadline-ended turn in the middle."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import Agent, AgentRunCheckpoint, Compaction, LLMResponse, ScriptedProvider, ToolCall
from agent import tool as make_tool
from tasks import TurnDeadLettered, load_conversation, run_turn, turn_status
from tasks.core.errors import TurnCancelled, UnreadableConversation
from tasks.core.keys import Keys
from tasks.core.namespaces import namespace_for
from tasks.operate.control import cancel_turn
from tasks.queue.context import job_context
from tasks.store import conversations
from tasks.store.conversations import (
    MAX_CONVERSATION_FRAMES,
    ConversationStore,
    RecentConversations,
    StoredConversation,
    envelope_bytes,
    read_conversation,
    read_envelope,
    turn_write,
)
from tasks.store.progress import FrameWriter
from tasks.store.records import TurnRecords
from tasks.testing import RedisServer, wait_until

NS = "_/_/c"
KEY = "k"


@make_tool
def lookup(order_id: str, amount: float = 0) -> str:
    """Look an order up."""
    return f"{order_id}: shipped ({amount})"


def next_turn(
    stored: AgentRunCheckpoint | None, message: str = "where?", rounds: int = 1, fold: bool = False
) -> AgentRunCheckpoint:
    """The checkpoint a turn of the runtime ends with, from `stored`."""
    steps = [
        LLMResponse(
            tool_calls=[ToolCall(f"c{i}", "lookup", {"order_id": f"A{i}", "amount": i + 0.5})]
        )
        for i in range(rounds)
    ]
    steps.append(LLMResponse(content=f"answer to {message}"))
    options: dict[str, Any] = {}
    if fold:
        options["compaction"] = Compaction(max_messages=8, keep_last=2)
    agent = Agent(provider=ScriptedProvider(steps), model="m", tools=[lookup], **options)
    return agent.run({"message": message, "continueFrom": stored}).checkpoint


def grown(turns: int = 8) -> AgentRunCheckpoint:
    """A conversation some turns long: one turn's frame is then small beside its envelope."""
    checkpoint = None
    for n in range(turns):
        checkpoint = next_turn(checkpoint, f"earlier {n}")
    assert checkpoint is not None
    return checkpoint


class MemoryStore:
    """The stored conversation's two keys as succeed.lua, ConversationStore.save and an earlier
    release's worker write them."""

    def __init__(self) -> None:
        self.envelope: bytes | None = None
        self.frames: list[bytes] = []

    def commit(self, envelope: bytes, frame: bytes) -> None:  # succeed.lua
        if envelope:
            self.envelope, self.frames = envelope, []
        else:
            self.frames.append(frame)

    def read(self) -> StoredConversation | None:
        if self.envelope is None:
            return None
        return read_conversation(self.envelope, self.frames, KEY, NS)


def end_turn(
    store: MemoryStore, checkpoint: AgentRunCheckpoint, **options: Any
) -> StoredConversation:
    """A turn's end that started from what `store` holds: its write, committed."""
    write = turn_write(store.read(), checkpoint, **options)
    assert bool(write.envelope) != bool(write.frame)
    store.commit(write.envelope, write.frame)
    return write.stored


def same(a: AgentRunCheckpoint | None, b: AgentRunCheckpoint | None) -> bool:
    assert a is not None and b is not None
    return a.to_json() == b.to_json()


# -- one turn's write ----------------------------------------------------------------------------


def test_the_first_turn_writes_a_whole_envelope() -> None:
    checkpoint = next_turn(None)
    write = turn_write(None, checkpoint, saved_at_ms=7)
    assert (write.frame, orjson.loads(write.envelope)["savedAt"]) == (b"", 7)
    assert read_envelope(write.envelope, KEY, NS).to_json() == checkpoint.to_json()
    assert write.stored == StoredConversation(write.envelope, (), 7, checkpoint)


def test_later_turns_append_frames_until_they_would_outweigh_the_envelope() -> None:
    store, checkpoint, layouts = MemoryStore(), None, []
    for n in range(60):
        checkpoint = next_turn(checkpoint, f"turn {n}", rounds=n % 3)
        end_turn(store, checkpoint)
        assert store.envelope is not None
        layouts.append((store.envelope, len(store.frames)))
        # the frames never hold more than the envelope, nor more than the cap
        assert sum(len(f) for f in store.frames) <= len(store.envelope)
        assert len(store.frames) <= MAX_CONVERSATION_FRAMES
        assert same(store.read().checkpoint, checkpoint)  # type: ignore[union-attr]
    # each frame is the one turn's change, on the envelope's savedAt
    saved_at = orjson.loads(store.envelope)["savedAt"]
    assert all(orjson.loads(f)["on"] == saved_at for f in store.frames)
    # the envelope is written again geometrically seldom: the frames add up to it first
    compactions = len({envelope for envelope, _ in layouts})
    assert 3 <= compactions <= 12, compactions
    assert max(count for _, count in layouts) >= 8


def test_a_conversation_is_compacted_at_the_frame_cap() -> None:
    store, checkpoint = MemoryStore(), grown()
    counts = []
    for n in range(9):
        checkpoint = next_turn(checkpoint, f"turn {n}", rounds=0)
        end_turn(store, checkpoint, max_frames=3)
        counts.append(len(store.frames))
    assert counts == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_a_turn_from_its_own_checkpoint_compacts() -> None:
    checkpoint = next_turn(next_turn(None))
    write = turn_write(None, checkpoint)
    assert write.envelope and not write.frame


def test_an_envelope_written_whole_without_frames_wins_over_the_frames_left() -> None:
    # Given a stored conversation with frames
    store, checkpoint = MemoryStore(), grown()
    for n in range(3):
        checkpoint = next_turn(checkpoint, f"turn {n}")
        end_turn(store, checkpoint)
    assert len(store.frames) == 2
    # When something that knows nothing of frames writes an envelope whole, frames left
    other = next_turn(None, "imported")
    store.envelope = envelope_bytes(other)
    # Then the envelope is the conversation, and the next turn compacts the stale frames away
    stored = store.read()
    assert stored is not None and same(stored.checkpoint, other) and not stored.current
    after = next_turn(stored.checkpoint, "after")
    end_turn(store, after)
    assert store.frames == []
    assert same(store.read().checkpoint, after)  # type: ignore[union-attr]


def test_a_compaction_never_takes_the_saved_at_the_frames_name() -> None:
    store = MemoryStore()
    first = next_turn(None)
    end_turn(store, first, saved_at_ms=5)
    end_turn(store, next_turn(first), saved_at_ms=5, max_frames=0)
    assert store.envelope is not None and orjson.loads(store.envelope)["savedAt"] == 6


def test_frames_that_do_not_fit_their_envelope_are_unreadable() -> None:
    checkpoint = next_turn(None)
    envelope = envelope_bytes(checkpoint, saved_at_ms=1)
    on = b'"on":1,"onBytes":%d' % len(envelope)
    past = b'{"keys":["history"],"head":{},"lists":{"history":[99,[]]},%s}' % on
    for frames in ([b"not json"], [b"[1]"], [past], [b"{%s}" % on]):
        with pytest.raises(UnreadableConversation, match="frames do not fit"):
            read_conversation(envelope, frames, KEY, NS)
    # a frame on another envelope (another savedAt, or another size) is not read at all
    for elsewhere in (
        past.replace(b'"on":1', b'"on":2'),
        past.replace(b'"onBytes":', b'"onBytes":9'),
    ):
        assert same(read_conversation(envelope, [elsewhere], KEY, NS).checkpoint, checkpoint)


def test_a_frame_that_moves_the_conversation_to_another_namespace_is_refused() -> None:
    mine = next_turn(None)
    foreign = AgentRunCheckpoint.from_parsed(
        {**orjson.loads(mine.to_json()), "identity": {"tenant": "acme", "conversationId": "c"}}
    )
    write = turn_write(StoredConversation(envelope_bytes(mine, 1), (), 1, mine), foreign)
    assert write.frame
    with pytest.raises(UnreadableConversation, match="another namespace"):
        read_conversation(envelope_bytes(mine, 1), [write.frame], KEY, NS)


# -- the checked conversations a worker keeps ----------------------------------------------------


def test_the_worker_that_wrote_the_last_turn_reads_it_without_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker that wrote a compaction, then a frame
    store, recent = MemoryStore(), RecentConversations()
    first = grown()
    recent.remember(NS, end_turn(store, first))
    assert store.envelope is not None
    assert recent.read(store.envelope, store.frames, KEY, NS).checkpoint is first
    second = next_turn(first)
    recent.remember(NS, end_turn(store, second))
    assert len(store.frames) == 1

    # When it claims the next turn with those bytes, nothing is parsed
    def refuse(*args: Any) -> Any:
        raise AssertionError("parsed again")

    monkeypatch.setattr(conversations, "read_conversation", refuse)
    found = recent.read(store.envelope, list(store.frames), KEY, NS)
    assert found.checkpoint is second


def test_frames_another_worker_appended_are_applied_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker that read a conversation, and two turns another worker appended since
    store, recent = MemoryStore(), RecentConversations()
    checkpoint = grown()
    end_turn(store, checkpoint)
    assert store.envelope is not None
    recent.read(store.envelope, [], KEY, NS)
    for message in ("two", "three"):
        checkpoint = next_turn(checkpoint, message)
        end_turn(store, checkpoint)
    assert len(store.frames) == 2
    whole = read_conversation(store.envelope, store.frames, KEY, NS)

    # When it claims the next turn: only the new frames are applied, the envelope not parsed
    monkeypatch.setattr(conversations, "read_conversation", None)
    found = recent.read(store.envelope, store.frames, KEY, NS)
    assert same(found.checkpoint, whole.checkpoint) and same(found.checkpoint, checkpoint)
    assert found.frames == tuple(store.frames) and found.current


def test_another_envelope_is_read_afresh_and_a_huge_one_not_kept() -> None:
    recent = RecentConversations(max_bytes=4000)
    small, large = next_turn(None), next_turn(None, "x" * 2000)
    first = recent.read(envelope_bytes(small, 1), [], KEY, NS)
    assert recent.read(envelope_bytes(small, 1), [], KEY, NS) is first
    assert recent.read(envelope_bytes(small, 2), [], KEY, NS) is not first
    big = envelope_bytes(large, 3)
    assert recent.read(big, [], KEY, NS) is not recent.read(big, [], KEY, NS)


# -- property: whatever the sequence, the conversation reads back as the last turn left it -----

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["turn", "turn", "turn", "fold", "earlier_release", "save"]),
        st.integers(0, 3),  # tool rounds
        st.sampled_from([MAX_CONVERSATION_FRAMES, 0, 1, 2, 5]),  # the frame cap
        st.integers(0, 1),  # which of two workers runs it
        st.booleans(),  # a compaction in the millisecond of the envelope it replaces
        st.text(st.characters(exclude_categories=("Cs",)), max_size=12).filter(str.strip),
    ),
    min_size=1,
    max_size=18,
)


@settings(max_examples=60, deadline=None)
@given(actions=ACTIONS)
def test_appends_and_compactions_read_back_as_the_last_checkpoint(
    actions: list[tuple[str, int, int, int, bool, str]],
) -> None:
    store, workers = MemoryStore(), [RecentConversations(), RecentConversations()]
    last: AgentRunCheckpoint | None = None
    for kind, rounds, cap, worker, same_ms, message in actions:
        stored = None
        if store.envelope is not None:
            stored = workers[worker].read(store.envelope, store.frames, KEY, NS)
            assert same(stored.checkpoint, last)
        base = stored.checkpoint if stored is not None else None
        if kind == "earlier_release":
            # a worker of an earlier release: reads the envelope alone, writes it whole
            alone = read_envelope(store.envelope, KEY, NS) if store.envelope else None
            last = next_turn(alone, message, rounds)
            store.envelope = envelope_bytes(last)
        elif kind == "save":
            last = next_turn(base, message, rounds)
            store.envelope, store.frames = envelope_bytes(last), []
        else:
            last = next_turn(base, message, rounds, fold=kind == "fold")
            saved_at = stored.saved_at if same_ms and stored is not None else None
            write = turn_write(stored, last, saved_at_ms=saved_at, max_frames=cap)
            store.commit(write.envelope, write.frame)
            workers[worker].remember(NS, write.stored)
        read = store.read()
        assert read is not None and read.checkpoint.to_json() == last.to_json()
        assert list(read.checkpoint.wire()) == list(last.wire())  # key order too


# -- through the scripts, on a real Redis --------------------------------------------------------

PREFIX = "frametest"
PAYLOAD = b'{"agent":"demo","conversation_id":"c","message":"hi"}'


@pytest.fixture(scope="module")
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_server.url)
    yield connection
    connection.close()


class ScriptWorker:
    """What a worker does of a turn, around the agent: claim it with the stored conversation,
    read that (through its RecentConversations), end it with turn_write's write."""

    def __init__(self, records: TurnRecords) -> None:
        self.records = records
        self.recent = RecentConversations()

    def run(self, namespace: str, message: str, rounds: int, **options: Any) -> AgentRunCheckpoint:
        turn_id, token = uuid.uuid4().hex, uuid.uuid4().hex
        self.records.register(
            turn_id, payload=PAYLOAD, agent="demo", conversation_id="c", namespace=namespace
        )
        claimed = self.records.claim(turn_id, namespace, token, 30, "w")
        assert claimed.record is not None
        started = None
        if claimed.stored is not None:
            key = self.records.keys.conversation(namespace)
            started = self.recent.read(claimed.stored, claimed.stored_frames, key, namespace)
        checkpoint = next_turn(started.checkpoint if started else None, message, rounds)
        write = turn_write(started, checkpoint, **options)
        ended = self.records.succeed(
            turn_id,
            namespace,
            token,
            envelope=write.envelope,
            frame=write.frame,
            result=b'{"content":"ok"}',
            ttl_s=60,
        )
        assert ended.ended
        self.recent.remember(namespace, write.stored)
        return checkpoint


@settings(max_examples=20, deadline=None)
@given(actions=ACTIONS)
def test_through_the_scripts_the_conversation_reads_back_as_the_last_turn_left_it(
    client: redis.Redis, actions: list[tuple[str, int, int, int, bool, str]]
) -> None:
    keys = Keys(PREFIX, 4)
    namespace = f"_/_/c-{uuid.uuid4().hex[:8]}"
    records = TurnRecords(client, keys)
    store = ConversationStore(client, keys)
    workers = [ScriptWorker(records), ScriptWorker(records)]
    last: AgentRunCheckpoint | None = None
    for kind, rounds, cap, worker, _, message in actions:
        if kind == "earlier_release":
            raw = client.get(keys.conversation(namespace))
            alone = read_envelope(raw, KEY, namespace) if isinstance(raw, bytes) else None
            last = next_turn(alone, message, rounds)
            client.set(keys.conversation(namespace), envelope_bytes(last))
        elif kind == "save":
            last = next_turn(store.load(namespace), message, rounds)
            store.save(namespace, last)
            assert not client.exists(keys.conversation_frames(namespace))
        else:
            last = workers[worker].run(namespace, message, rounds, max_frames=cap)
        loaded = store.load(namespace)
        assert loaded is not None and loaded.to_json() == last.to_json()
    client.delete(keys.conversation(namespace), keys.conversation_frames(namespace))


def test_a_turn_ended_from_outside_keeps_base_and_frames_and_its_progress_reads_right(
    client: redis.Redis,
) -> None:
    # Given a conversation of an envelope and frames, and a turn on it with one round persisted
    keys = Keys(PREFIX, 4)
    namespace = f"_/_/c-{uuid.uuid4().hex[:8]}"
    records, store = TurnRecords(client, keys), ConversationStore(client, keys)
    worker = ScriptWorker(records)
    store.save(namespace, grown())
    for n in range(3):
        worker.run(namespace, f"turn {n}", 1)
    assert client.llen(keys.conversation_frames(namespace)) == 3
    stored = store.load(namespace)
    records.register(
        "t-out", payload=PAYLOAD, agent="demo", conversation_id="c", namespace=namespace
    )
    claimed = records.claim("t-out", namespace, "tok", 30, "w")
    assert len(claimed.stored_frames) == 3
    round_one = next_turn(stored, "cut short", rounds=1)  # stands for its first round's report
    frame = FrameWriter(stored).frame(round_one)
    assert records.renew("t-out", namespace, "tok", 30, frame=frame, iteration=2)
    assert same(records.progress(records.get("t-out", namespace)), round_one)  # type: ignore[arg-type]

    # When it is cancelled, and the conversation moves on (a compaction: no frames left)
    assert records.cancel("t-out", namespace, reason="test", ttl_s=60).ended
    worker.run(namespace, "later", 0, max_frames=0)
    assert not client.exists(keys.conversation_frames(namespace))

    # Then its progress still reads as it was, from the base and frames it kept
    record = records.get("t-out", namespace)
    assert record is not None and len(record.base_frames) == 3
    assert same(records.progress(record), round_one)


# -- real workers --------------------------------------------------------------------------------


def layout(jobs: Any, namespace: str) -> tuple[int, int]:
    """The stored conversation's envelope savedAt and how many frames it has."""
    ctx = job_context()
    envelope = jobs.redis.get(ctx.keys.conversation(namespace))
    return orjson.loads(envelope)["savedAt"], jobs.redis.llen(
        ctx.keys.conversation_frames(namespace)
    )


def wait_round(turn_id: str) -> None:
    wait_until(lambda: (s := turn_status(turn_id)) and s.iteration >= 2, 20, "its first round")


@pytest.mark.integration
def test_a_long_conversation_with_turns_ended_from_outside_reads_back_whole(jobs: Any) -> None:
    ctx = job_context()
    namespace = namespace_for("c-long", None)
    sent: list[str] = []
    answers: list[str] = []
    layouts: list[tuple[int, int]] = []
    cut_short: dict[str, tuple[str, AgentRunCheckpoint]] = {}
    for n in range(1, 41):
        frames = layouts[-1][1] if layouts else 0
        if n >= 12 and frames >= 1 and "cancelled" not in cut_short:
            # a turn cancelled after its first round, while the conversation has frames
            before = load_conversation("c-long")
            assert before is not None
            held = run_turn.delay(
                agent="demo", conversation_id="c-long", message="held rounds:3 slow:1"
            )
            wait_round(held.id)
            assert cancel_turn(held.id, reason="test")
            with pytest.raises(TurnCancelled):
                held.get(timeout=10)
            cut_short["cancelled"] = (held.id, before)
        elif n >= 25 and frames >= 1 and "deadline" not in cut_short:
            # a turn the pump ends at its deadline, after its first round
            before = load_conversation("c-long")
            assert before is not None
            late = run_turn.delay(
                agent="demo",
                conversation_id="c-long",
                message="late rounds:5 slow:1",
                deadline_s=2.5,
            )
            with pytest.raises(TurnDeadLettered) as failed:
                late.get(timeout=20)
            assert failed.value.reason == "deadline_exceeded"
            cut_short["deadline"] = (late.id, before)
        message = f"t{n} rounds:2"
        reply = run_turn.delay(agent="demo", conversation_id="c-long", message=message).get(
            timeout=30
        )
        sent.append(message)
        answers.append(reply["content"])
        layouts.append(layout(jobs, namespace))

    # The conversation reads back as its transcript: every message sent, every answer, in order
    stored = load_conversation("c-long")
    assert stored is not None
    history = stored.history
    assert [m["content"] for m in history if m["role"] == "user"] == sent
    final = [m for m in history if m["role"] == "assistant" and not m.get("toolCalls")]
    assert [m["content"] for m in final] == answers
    assert sum(m["role"] == "tool" for m in history) == 2 * len(sent)
    assert AgentRunCheckpoint.from_json(stored.to_json()).to_json() == stored.to_json()

    # Its turns appended frames, and the envelope was written whole again geometrically seldom
    counts = [count for _, count in layouts]
    compactions = len({saved_at for saved_at, _ in layouts})
    assert max(counts) >= 4 and max(counts) <= MAX_CONVERSATION_FRAMES
    assert 3 <= compactions <= 14, layouts
    assert sum(1 for a, b in itertools.pairwise(counts) if b < a) >= 2, counts  # dropped to 0

    # The turns ended from outside kept the conversation they built on, frames and all: their
    # progress is that conversation and their first round
    assert set(cut_short) == {"cancelled", "deadline"}
    for turn_id, before in cut_short.values():
        record = ctx.records.get(turn_id, namespace)
        assert record is not None and record.frames and record.base and record.base_frames
        progress = ctx.records.progress(record)
        assert progress is not None
        prefix = len(before.history)
        assert orjson.dumps(progress.history[:prefix]) == orjson.dumps(before.history)
        added = progress.history[prefix:]
        assert added[0]["role"] == "user" and added[0]["content"] in (
            "held rounds:3 slow:1",
            "late rounds:5 slow:1",
        )
        assert any(m["role"] == "tool" for m in added)


@pytest.mark.integration
def test_an_envelope_an_earlier_release_wrote_whole_wins_over_the_frames(jobs: Any) -> None:
    ctx = job_context()
    namespace = namespace_for("c-old", None)
    frames_key = ctx.keys.conversation_frames(namespace)
    # Given a conversation grown long enough for its turns to append frames
    sent = []
    while jobs.redis.llen(frames_key) < 2:
        assert len(sent) < 20, "no frames appended"
        sent.append(f"t{len(sent)} rounds:1")
        run_turn.delay(agent="demo", conversation_id="c-old", message=sent[-1]).get(timeout=30)
    # When a worker of an earlier release writes the envelope whole, leaving the frames
    imported = next_turn(None, "imported", rounds=0)
    jobs.redis.set(ctx.keys.conversation(namespace), envelope_bytes(imported))
    loaded = load_conversation("c-old")
    assert loaded is not None and loaded.to_json() == imported.to_json()
    # Then the next turn goes on from that envelope, and compacts the stale frames away
    run_turn.delay(agent="demo", conversation_id="c-old", message="after").get(timeout=30)
    stored = load_conversation("c-old")
    assert stored is not None
    assert [m["content"] for m in stored.history if m["role"] == "user"] == ["imported", "after"]
    assert jobs.redis.llen(frames_key) == 0
