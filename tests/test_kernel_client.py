"""`lab.workflow.kernel_client`: the notebook runner's kernel channels read in short polls (jupyter/nbclient#312).

A socket whose message has arrived but whose wake-up was missed is simulated: a poll sees the message only
when its wait ends (pyzmq checks the socket again then). nbclient's own channel, waiting once for the cell
timeout, returns it only after that timeout; the polling channel within one slice."""

import asyncio
import time
from queue import Empty

import pytest
import zmq
from jupyter_client.channels import AsyncZMQSocketChannel

from lab.workflow.kernel_client import POLL_S, PollingChannel, PollingKernelClient, PollingKernelManager


class _MissedWakeUp:
    def __init__(self, ready: bool):
        self.ready = ready

    async def poll(self, timeout_ms=None):
        await asyncio.sleep(3600 if timeout_ms is None else timeout_ms / 1000)
        return zmq.POLLIN if self.ready else 0


def _channel(cls, ready: bool = True):
    channel = cls.__new__(cls)  # no kernel: the socket is the fake above
    channel.socket = _MissedWakeUp(ready)

    async def recv(**kwargs):
        return {"msg_type": "execute_reply"}

    channel._recv = recv
    return channel


def _get(cls, timeout, within, ready=True):
    return asyncio.run(asyncio.wait_for(_channel(cls, ready).get_msg(timeout=timeout), within))


@pytest.mark.parametrize("cell_timeout", [300, None])  # the shell channel's wait, and IOPub's (no timeout)
def test_a_missed_wake_up_costs_one_poll_not_the_cell_timeout(cell_timeout):
    start = time.monotonic()
    assert _get(PollingChannel, cell_timeout, within=4 * POLL_S)["msg_type"] == "execute_reply"
    assert time.monotonic() - start < 2 * POLL_S
    with pytest.raises(asyncio.TimeoutError):  # nbclient's channel: the defect this module works around
        _get(AsyncZMQSocketChannel, cell_timeout, within=4 * POLL_S)


def test_the_callers_timeout_still_holds():
    start = time.monotonic()
    with pytest.raises(Empty):
        _get(PollingChannel, 2.2 * POLL_S, within=10 * POLL_S, ready=False)
    assert 2.2 * POLL_S <= time.monotonic() - start < 4 * POLL_S


def test_run_notebook_executes_with_the_polling_client(monkeypatch, tmp_path):
    import papermill

    from lab.workflow.notebook import run_notebook

    seen = {}
    monkeypatch.setattr(papermill, "execute_notebook", lambda *args, **kwargs: seen.update(kwargs))
    run_notebook("00_engine_tour", root=tmp_path)
    manager = seen["kernel_manager_class"]
    assert manager is PollingKernelManager and manager(kernel_name="python3").client_factory is PollingKernelClient
    client = PollingKernelClient()
    assert client.shell_channel_class is PollingChannel and client.iopub_channel_class is PollingChannel
