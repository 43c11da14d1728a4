"""The deploying process's bounded calls to workers (control/gateway.py) leave no RPC coroutine
unawaited when the poll that made them is cancelled before they start (a deployment stopping:
the suite's "coroutine 'PooledRPCCall...send_recv_from_rpc' was never awaited" warnings). The
real calls run in every integration test; here a client whose RPCs are coroutines, as Dask's."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from pescheduler.control.gateway import WorkerGateway


class SlowRpc:
    """A worker's RPC proxy: each call a coroutine answering after a while (Dask's
    ``PooledRPCCall`` makes ``send_recv_from_rpc`` coroutines the same way)."""

    def __getattr__(self, name: str):
        async def send_recv_from_rpc(**kwargs):
            await asyncio.sleep(5)
            return {}
        return send_recv_from_rpc


class Client:
    def rpc(self, address: str) -> SlowRpc:
        return SlowRpc()


@pytest.mark.parametrize("poll", ["stats", "first_gone", "drain", "ckpt_end"])
def test_a_poll_of_the_workers_cancelled_before_its_calls_start_leaves_no_call_unawaited(poll):
    gateway = WorkerGateway(Client(), "d", ())

    async def workers():
        return {}

    gateway.workers = workers

    async def cancelled_at_once() -> None:
        workers = ["tcp://a:1", "tcp://b:2"]
        task = asyncio.ensure_future(gateway.ckpt_end(workers, 1, True) if poll == "ckpt_end"
                                     else getattr(gateway, poll)(workers))
        await asyncio.sleep(0)              # the poll runs to its gather: the calls are scheduled, not started
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(cancelled_at_once())
        gc.collect()
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not unawaited, unawaited


def test_a_checkpoints_end_that_times_out_says_so(caplog):
    """A worker that does not answer ``pe_ckpt_end`` in time: the warning names the wait and the
    setting (a TimeoutError's message is empty: bench/state.py's 10^7 rows logged "ending
    checkpoint 3 on tcp://... failed: " and nothing more)."""
    gateway = WorkerGateway(Client(), "d", ())
    gateway.worker_timeout = 0.01
    with caplog.at_level("WARNING", logger="pescheduler.control.gateway"):
        asyncio.run(gateway.ckpt_end(["tcp://a:1"], 3, True))
    assert "ending checkpoint 3 on tcp://a:1 failed: no answer within 0.01 s (pescheduler.calls.worker)" \
        in caplog.text, caplog.text
