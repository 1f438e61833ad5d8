"""The watch of a multi-process run's processes on each other (`jaxrubric.peer_watch`), polled
by hand over an in-memory key-value store and a clock the test moves; the real thing, with
processes killed, is `test_multihost_faults.py`."""

from __future__ import annotations

import pytest

from jaxrubric.peer_watch import EXITING, PeerWatch


class Store:
    """The coordination service's key-value store, in memory; `down` makes every call fail."""

    def __init__(self):
        self.values: dict[str, str] = {}
        self.down = False

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        if self.down:
            raise RuntimeError("UNAVAILABLE: Socket closed\nmore detail")
        assert allow_overwrite or key not in self.values
        self.values[key] = value

    def key_value_dir_get(self, key: str) -> list[tuple[str, str]]:
        if self.down:
            raise RuntimeError("UNAVAILABLE: Socket closed")
        return [(k, v) for k, v in self.values.items() if k.startswith(key)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster():
    """Three processes' watches on one store and one clock, 10 s timeout."""
    store, clock = Store(), Clock()
    return store, clock, [PeerWatch(store, i, 3, 10.0, clock) for i in range(3)]


def _poll(watches, clock, seconds, alive=(0, 1, 2)):
    """Moves the clock by one poll interval at a time for `seconds`; the processes in `alive`
    poll. The verdicts of process 0, in order."""
    verdicts = []
    for _ in range(int(seconds / watches[0].interval)):
        clock.now += watches[0].interval
        for i in alive:
            verdict = watches[i].check()
            if i == 0 and verdict:
                verdicts.append(verdict)
    return verdicts


def test_a_silent_process_is_named_after_the_timeout(cluster):
    store, clock, watches = cluster
    assert watches[0].interval == 2.5
    assert _poll(watches, clock, 60) == []  # all alive: nothing, however long
    assert _poll(watches, clock, 10, alive=(0, 1)) == []  # process 2 silent for 10 s: not yet
    verdicts = _poll(watches, clock, 5, alive=(0, 1))
    assert verdicts and verdicts[0] == (
        "jaxrubric: process 2 of 3 sent no heartbeat for 12 s (host lost, killed or hung); "
        "process 0 stops too (exit 75): relaunch to resume from the last complete checkpoint")


def test_a_process_that_never_beats_is_lost_too(cluster):
    _, clock, watches = cluster
    assert _poll(watches, clock, 15, alive=(0, 1))[0].startswith(
        "jaxrubric: process 2 of 3 sent no heartbeat for 12 s")


def test_a_process_leaving_normally_is_never_reported(cluster):
    store, clock, watches = cluster
    _poll(watches, clock, 5)
    watches[2].leave()
    assert store.values["jaxrubric/heartbeat/2"] == EXITING
    assert _poll(watches, clock, 60, alive=(0, 1)) == []
    assert watches[2].check() is None  # a leaving process judges no one


def test_losing_the_coordination_service_is_said_in_one_line(cluster):
    store, clock, watches = cluster
    store.down = True
    assert watches[1].check() == (
        "jaxrubric: process 1 of 3 lost the coordination service on process 0 (UNAVAILABLE: "
        "Socket closed); stopping (exit 75)")
    watches[1].leave()  # at exit the service goes away as the run ends: not a fault
    assert watches[1].check() is None


def test_alive_since_waits_for_a_heartbeat_of_every_peer(cluster):
    _, clock, watches = cluster

    def beat(*processes):
        for i in processes:
            clock.now += 1
            watches[i].check()

    _poll(watches, clock, 5)
    beat(0)  # process 0 has read every heartbeat so far
    moment = clock.now
    assert not watches[0].all_alive_since(moment)
    beat(1, 0)
    assert not watches[0].all_alive_since(moment)  # process 2 has not beaten since
    beat(2, 0)
    assert watches[0].all_alive_since(moment)
