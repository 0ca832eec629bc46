"""Read-your-writes through the projection: workers learn whether their claim won."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.errors import BackendUnavailable, Fenced
from effectlog.log import EventLog, open_log
from effectlog.model import EffectEvent, State
from effectlog.worker import EffectCall, Worker
from projections import open_reader
from projections.projector import Projector, ProjectorSettings, project
from projections.view import ProjectionView

KIND, TARGET = "payment.charge", "acct-1"
KEY = f"agent:op1:{KIND}:{TARGET}"


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return open_log(f"sqlite:///{tmp_path}/log.db")


@pytest.fixture
def projector(log: EventLog, tmp_path: Path) -> Iterator[Projector]:
    """A projector running in a thread, as `effectlog project` would in another process."""
    projector = Projector(log, tmp_path / "state", ProjectorSettings(idle_sleep_s=0.005))
    projector.open()
    stop = threading.Event()
    thread = threading.Thread(target=projector.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    yield projector
    stop.set()
    thread.join(10)
    projector.close()


class RacingView(ProjectionView):
    """Holds each worker after it read the current state until the other has read it too."""

    def __init__(self, log: EventLog, state: Path, barrier: threading.Barrier) -> None:
        super().__init__(log, state)
        self.barrier = barrier
        self.armed = False

    def current(self, key: str) -> EffectEvent | None:
        found = super().current(key)
        if self.armed:
            self.armed = False
            self.barrier.wait(10)
        return found


def test_two_workers_racing_a_claim_learn_who_won(log: EventLog, tmp_path: Path,
                                                  projector: Projector) -> None:
    state = tmp_path / "state"
    first = Worker(log, "w0", view=ProjectionView(log, state))
    first.create("op1", KIND, TARGET, {"amount": 5})
    first.reserve(KEY)
    barrier = threading.Barrier(2)
    views = {name: RacingView(log, state, barrier) for name in ("w1", "w2")}
    outcomes: dict[str, EffectEvent | Fenced] = {}

    def claim(name: str) -> None:
        worker = Worker(log, name, view=views[name])
        views[name].armed = True
        try:
            outcomes[name] = worker.reserve(KEY)
        except Fenced as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=claim, args=(name,)) for name in views]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = {n: o for n, o in outcomes.items() if isinstance(o, EffectEvent)}
    losers = {n: o for n, o in outcomes.items() if isinstance(o, Fenced)}
    assert len(winners) == 1 and len(losers) == 1, outcomes
    (winner, event), (_, lost) = next(iter(winners.items())), next(iter(losers.items()))
    assert lost.reason == "lost_race"
    assert (event.fencing_epoch, event.worker_id) == (2, winner)
    with open_reader(state) as reader:
        current = reader.get(KEY)
        assert current is not None and (current.worker_id, current.fencing_epoch) == (winner, 2)
        assert reader.counts()["rejected:stale_epoch"] == 1
    loser_worker = Worker(log, next(iter(losers)), view=views[next(iter(losers))])
    with pytest.raises(Fenced):  # the loser cannot dispatch under the winner's epoch
        loser_worker.dispatch(KEY)
    for view in views.values():
        view.close()


def test_current_waits_for_the_projection_to_reach_the_log(log: EventLog, tmp_path: Path,
                                                           projector: Projector) -> None:
    view = ProjectionView(log, tmp_path / "state")
    writer = Worker(log, "w1", verify=False)
    writer.create("op1", KIND, TARGET, {"amount": 1})
    writer.reserve(KEY)  # appended without waiting for the projection
    current = view.current(KEY)
    view.close()
    assert current is not None and current.state is State.RESERVED


def test_accepted_times_out_without_a_projector(log: EventLog, tmp_path: Path) -> None:
    # a record before it, projected once: the view answers the worker's read, but the worker
    # cannot judge its own append alone (at offset 0 of an empty partition it could), so it
    # waits for a projection that no longer runs
    Worker(log, "w0").create("op0", KIND, TARGET, {"amount": 0})
    project(log, tmp_path / "state")
    view = ProjectionView(log, tmp_path / "state")
    worker = Worker(log, "w1", view=view, accept_timeout_s=0.2)
    with pytest.raises(BackendUnavailable, match="projection has not applied"):
        worker.create("op1", KIND, TARGET, {"amount": 1})
    view.close()


def test_worker_runs_a_whole_effect_on_the_projection_view(log: EventLog, tmp_path: Path,
                                                           projector: Projector) -> None:
    view = ProjectionView(log, tmp_path / "state")
    worker = Worker(log, "w1", view=view)
    calls: list[int] = []

    def charge(call: EffectCall) -> dict[str, int]:
        calls.append(call.fencing_epoch)
        return {"charged": 3}

    result = worker.perform("op1", KIND, TARGET, {"amount": 3}, charge)
    again = worker.perform("op1", KIND, TARGET, {"amount": 3}, charge)
    view.close()
    assert result == again == {"charged": 3} and calls == [1]
