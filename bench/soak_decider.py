"""The mixed soak's person in the loop (bench/soak.py --mixed starts it as a process of its
own): it watches the paused turns and decides each pending approval as soak_agent.decision_for
says (approve, reject with soak_agent.REJECTION, or leave it to expire), through the same calls
an operator's tool makes, and records what it decided. It waits out Redis restarts, and runs
until its stop file appears.

    python bench/soak_decider.py STOP_FILE      (REDIS_URL and AGENTJOBS_* from the soak)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import soak_agent as sa  # noqa: E402
from tasks import ActionConflict, approve_action, reject_action  # noqa: E402
from tasks.operate.people import paused_turns  # noqa: E402
from tasks.queue.context import job_context  # noqa: E402

ACTOR = "soak-decider"


def decide_once(seed: int) -> int:
    ctx = job_context()
    decided = 0
    for record, pending in paused_turns(ctx):
        for action in pending:
            turn = int(action.args.get("turn", -1))
            decision = sa.decision_for(seed, turn)
            try:
                if decision == "approve":
                    approve_action(record.turn_id, action.request_id, actor=ACTOR)
                elif decision == "reject":
                    reject_action(
                        record.turn_id, action.request_id, message=sa.REJECTION, actor=ACTOR
                    )
                else:
                    continue
            except ActionConflict as exc:  # decided meanwhile, or no longer paused
                print(f"turn {turn}: {exc}", flush=True)
                continue
            ctx.redis.hset(sa.decisions_key(ctx.keys.prefix), str(turn), decision)
            decided += 1
    return decided


def main() -> int:
    stop = Path(sys.argv[1])
    seed = int(os.environ.get(sa.SEED_VARIABLE, "0"))
    print("soak decider started", flush=True)
    while not stop.exists():
        try:
            decide_once(seed)
        except (redis.ConnectionError, redis.TimeoutError):
            time.sleep(0.2)
        time.sleep(0.3)
    print("soak decider stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
