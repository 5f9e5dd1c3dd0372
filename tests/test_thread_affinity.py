"""HVDLITE_THREAD_AFFINITY (hvdrun --thread-affinity): which core each local rank's engine
thread gets, and pinning a real thread."""

import os
import threading

import pytest

from hvdlite.engine import thread_affinity


def test_one_core_per_local_rank():
    env = {"HVDLITE_THREAD_AFFINITY": "3, 7", "HOROVOD_THREAD_AFFINITY": "1,2"}
    assert [thread_affinity.core_for(r, 2, env) for r in (0, 1)] == [3, 7]  # HVDLITE_ wins
    assert thread_affinity.core_for(1, 2, {"HOROVOD_THREAD_AFFINITY": "1,2"}) == 2
    assert thread_affinity.core_for(0, 1, {"HOROVOD_THREAD_AFFINITY": "5"}) == 5
    assert thread_affinity.core_for(0, 4, {}) is None
    assert thread_affinity.core_for(0, 4, {"HVDLITE_THREAD_AFFINITY": " "}) is None
    with pytest.raises(ValueError, match="one core id per local rank"):
        thread_affinity.core_for(0, 2, {"HVDLITE_THREAD_AFFINITY": "1"})
    with pytest.raises(ValueError, match="HOROVOD_THREAD_AFFINITY='a,b' is not valid"):
        thread_affinity.core_for(0, 2, {"HOROVOD_THREAD_AFFINITY": "a,b"})


@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pins_only_the_calling_thread():
    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[-1]
    seen = {}

    def engine():
        seen["core"] = thread_affinity.pin_current_thread(
            0, 1, {"HVDLITE_THREAD_AFFINITY": str(core)}
        )
        seen["mask"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=engine)
    thread.start()
    thread.join()
    assert seen == {"core": core, "mask": {core}}
    assert sorted(os.sched_getaffinity(0)) == allowed  # this thread is untouched
