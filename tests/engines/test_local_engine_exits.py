"""A task that calls sys.exit fails that task only, in a worker process and in this one."""

import pytest
from cg_testutil import echo_or_die

from collapseguard.engines import InlineEngine, LocalEngine


@pytest.mark.parametrize("engine", [InlineEngine(), LocalEngine(2, threads_per_worker=1)],
                         ids=["inline", "local"])
def test_a_task_that_exits_fails_alone_and_every_task_is_reported_once(engine):
    tasks = ["a", "exit", "b", "c"]
    done = []
    engine.run(echo_or_die, tasks, "nss", (), None, lambda i, r, e: done.append((i, r, (e or "").split("\n")[0])))
    assert sorted(done) == [(0, "a", ""), (1, None, "SystemExit: 3"), (2, "b", ""), (3, "c", "")]
