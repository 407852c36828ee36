"""One attempt of a claimed turn on a worker: run the agent from where the turn stands, keep
its progress, journal and telemetry as it goes, then end or release the turn by the outcome
(`decide`, carried out by tasks/turn/ending.py).

    claimed  -> fresh start, resume after an error, or resume with a person's decisions
             -> progress after each tool round: a frame in the turn record (persist, then
                proceed); a tool call's start and outcome in the journal with its event
             -> one outcome: succeed, retry, pause, hand over, dead letter, or nothing (the
                turn is no longer this delivery's)

The job system meets the runtime at the check points of tasks/turn/checkpoints.py, one
object passed to the door: before a model call and before a tool call a turn that was
cancelled, is overdue, taken over or on a worker shutting down stops there, before it pays
for another call or runs another tool.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery.exceptions import Ignore

from agent import (
    AgentInput,
    AgentResult,
    AgentRunCheckpoint,
    RunPause,
)
from tasks.core.errors import BudgetWait, PoisonTurn, Reason
from tasks.core.namespaces import owner_of_namespace
from tasks.core.payload import TurnRequest, parse_payload
from tasks.queue.context import JobContext
from tasks.queue.results import writes_inline
from tasks.store.conversations import StoredConversation, turn_write
from tasks.store.journal import read_journal
from tasks.store.pending import recorded_decisions, requests_json
from tasks.store.progress import apply_frames
from tasks.store.records import Claim, TurnRecord
from tasks.turn import ending
from tasks.turn.checkpoints import TurnCheckpoints
from tasks.turn.outcomes import Decision, Outcome, decide
from tasks.turn.registry import build_agent

logger = logging.getLogger("agentjobs.turns")


class Attempt:
    """One delivery's work on one claimed turn: one attempt, then its outcome."""

    def __init__(
        self, ctx: JobContext, record: TurnRecord, *, token: str, stored: bytes | None
    ) -> None:
        self.ctx = ctx
        self.record = record
        self.turn_id = record.turn_id
        self.namespace = record.namespace
        self.token = token
        self.attempt = record.attempt
        self.stored = stored
        self.points = TurnCheckpoints(ctx, record, token)
        self.result: AgentResult | None = None
        # The Celery result is written already (by the ending): Celery must not write it again.
        self.result_stored = False

    def run(self) -> Decision:
        settings = self.ctx.settings
        if self.record.deliveries > settings.max_deliveries:
            poison = PoisonTurn(self.turn_id, self.record.deliveries - 1)
            return Decision(Outcome.DEAD_LETTER, Reason.POISON, poison)
        try:
            self.result = self._run_agent(parse_payload(self.record.payload, stored=True))
        except Exception as exc:
            decision = decide(exc, attempt=self.attempt, max_attempts=settings.max_attempts)
            if decision.reason is Reason.INTERNAL_ERROR:
                logger.exception("turn %s failed outside the agent run", self.turn_id)
            return decision
        if self.result.pause is not None:
            return Decision(Outcome.PAUSE)
        return Decision(Outcome.SUCCEED)

    def _run_agent(self, request: TurnRequest) -> AgentResult:
        """Run the agent through the door the turn's record calls for: a fresh start, a
        resume after an error or a crash, or a resume with a person's decisions. Every door
        streams: the answer text goes to the turn's events as the model writes it."""
        agent = build_agent(request.agent, self.ctx.settings.agents)
        points = self.points
        on_token = points.tokens.add
        # The iteration in flight when an earlier delivery stopped, if its response was kept:
        # it goes on without a second model call or a second run of a completed tool call.
        journal = read_journal(self.record.journal)
        stored = None
        if self.stored is not None:
            key = self.ctx.store.key(self.namespace)
            stored = self._read_stored(key)
        if not (self.record.checkpoint or self.record.frames):
            points.start_from(stored)
            turn_input = AgentInput(
                message=request.message,
                continue_from=stored,
                identity=request.identity,
                message_from=request.message_from,
                time=request.time,
            )
            return agent.run(turn_input, journal=journal, hooks=points, on_token=on_token)
        # A later attempt, or a redelivery after a crash: resume from the last persisted
        # progress; tools of completed iterations do not run again.
        base = stored
        if self.record.checkpoint:
            base = AgentRunCheckpoint.from_json(self.record.checkpoint)
        checkpoint = apply_frames(base, self.record.frames)
        assert checkpoint is not None
        points.start_from(checkpoint)
        decisions = recorded_decisions(self.record)
        if journal is not None and journal.requests and decisions:
            # A pause a person answered: go on with the decisions, not the model.
            pause = RunPause(checkpoint, journal, tuple(journal.requests.values()))
            return agent.resume(
                decisions, pause=pause, time=request.time, hooks=points, on_token=on_token
            )
        return agent.resume_on_error(
            checkpoint, time=request.time, journal=journal, hooks=points, on_token=on_token
        )

    # -- ending --------------------------------------------------------------------------------

    def finish(self, decision: Decision) -> dict[str, Any]:
        """Carry the outcome out (tasks/turn/ending.py); returns the reply or raises what
        Celery should see: Ignore for an unfinished turn (its state is mirrored already),
        TurnDeadLettered for a dead letter."""
        self.points.decided()
        if decision.outcome is not Outcome.IGNORE:
            self.points.flush()  # an outcome left to a progress write that did not come
        trace = self.points.trace
        if trace is not None:
            answer = self.result.content if self.result is not None else ""
            trace.outcome(str(decision.outcome), decision.error, str(decision.reason or ""), answer)
        outcome = decision.outcome
        if outcome is Outcome.SUCCEED:
            assert self.result is not None
            return self._succeed(self.result)
        self._write_usage()
        if outcome is Outcome.RETRY:
            assert decision.error is not None and decision.checkpoint is not None
            ending.schedule_retry(
                self.ctx,
                self.record,
                self.token,
                error=decision.error,
                checkpoint=decision.checkpoint,
                iteration=self.points.iteration,
            )
        elif outcome is Outcome.DEAD_LETTER:
            assert decision.reason is not None and decision.error is not None
            checkpoint = decision.checkpoint or self.points.last_checkpoint
            ended = ending.dead_letter(
                self.ctx,
                self.record,
                self.token,
                decision.reason,
                decision.error,
                checkpoint=checkpoint,
                patient=True,
            )
            if ended is not None:
                raise ended.error() from None
        elif outcome is Outcome.WAIT:
            assert isinstance(decision.error, BudgetWait)
            ending.wait(
                self.ctx,
                self.record,
                self.token,
                held=decision.error,
                iteration=self.points.iteration,
            )
        elif outcome is Outcome.PAUSE:
            assert self.result is not None and self.result.pause is not None
            self._pause(self.result.pause)
        elif outcome is Outcome.HAND_OVER:
            self._hand_over()
        else:
            ending.repair(self.ctx, self.record)
        raise Ignore()

    def _usage_json(self) -> bytes:
        tenant = owner_of_namespace(self.namespace)[0]
        return self.points.meter.usage.take_json(tenant, self.record.agent)

    def _write_usage(self) -> None:
        """The attempt's reported tokens, for an ending other than success (whose script
        takes them). Tokens spent are counted whatever became of the turn; a store that is
        away loses them, not the turn."""
        usage = self._usage_json()
        if not usage:
            return
        try:
            self.ctx.records.add_usage(self.turn_id, self.namespace, usage)
        except redis.RedisError as exc:
            logger.warning("turn %s: its token usage was not counted (%s)", self.turn_id, exc)

    def _succeed(self, result: AgentResult) -> dict[str, Any]:
        reply = {
            "conversationId": self.record.conversation_id,
            "turnNumber": result.turn_number,
            "runId": result.run_id,
            "content": result.content,
            "attempts": self.attempt,
        }
        # One conversation frame against the stored conversation the turn started from, or
        # the whole envelope again (tasks/store/conversations.py, turn_write).
        write = turn_write(self.started_from, result.checkpoint)
        if not ending.succeed(
            self.ctx,
            self.record,
            self.token,
            envelope=write.envelope,
            frame=write.frame,
            reply=reply,
            usage=self._usage_json(),
        ):
            raise Ignore()
        self.result_stored = writes_inline(self.ctx)
        self.ctx.store.recent.remember(self.namespace, write.stored)
        return reply

    def _pause(self, pause: RunPause) -> None:
        """Hold the turn for a person (tasks/operate/people.py)."""
        paused = ending.pause(
            self.ctx,
            self.record,
            self.token,
            info={"state": "paused", "attempt": self.attempt, "iteration": self.points.iteration},
            ttl_s=self.ctx.settings.pause_ttl_s,
            frame=self.points.frames.frame(pause.checkpoint),
            requests=requests_json(pause.pending),
            kinds=[(r.request_id, str(r.kind)) for r in pause.pending],
            journal=self.points.take_unwritten(),
        )
        if paused:
            logger.info(
                "turn %s paused for %d decision(s) of a person", self.turn_id, len(pause.pending)
            )

    def _hand_over(self) -> None:
        """This worker is shutting down (a deploy) and the run stopped at a check point: give
        the turn, as last persisted, to another worker now, rather than keep this one up or
        leave the turn a lease. Calls of a parallel response that were running have finished
        and journaled their outcomes by now; a response whose first call was about to start
        is journaled first, so the next worker does not ask the model again."""
        unwritten = self.points.take_unwritten()
        if unwritten and not ending.patiently(
            self.ctx,
            self.record,
            self.ctx.records.write_journal,
            self.turn_id,
            self.namespace,
            self.token,
            unwritten,
        ):
            return  # no longer ours: nothing to hand over
        if ending.hand_over(
            self.ctx,
            self.record,
            self.token,
            worker=self.record.worker,
            reason="shutdown",
            patient=True,
        ):
            logger.info(
                "turn %s handed over at iteration %d: this worker is shutting down",
                self.turn_id,
                self.points.iteration,
            )

    # -- the stored conversation --------------------------------------------------------------

    # The conversation frames on the envelope `stored` the claim brought.
    stored_frames: tuple[bytes, ...] = ()
    # That stored conversation, read and checked: what the turn started from (None: it starts
    # from nothing, or from a checkpoint of its own).
    started_from: StoredConversation | None = None

    @classmethod
    def from_claim(cls, ctx: JobContext, claim: Claim, *, token: str) -> Attempt:
        """The attempt on a claimed turn, with the stored conversation the claim brought."""
        assert claim.record is not None
        attempt = cls(ctx, claim.record, token=token, stored=claim.stored)
        attempt.stored_frames = claim.stored_frames
        return attempt

    def _read_stored(self, key: str) -> AgentRunCheckpoint:
        """The stored conversation the claim brought, checked (once per process and
        conversation: RecentConversations), kept as `started_from`."""
        assert self.stored is not None
        recent = self.ctx.store.recent
        self.started_from = recent.read(self.stored, self.stored_frames, key, self.namespace)
        return self.started_from.checkpoint
