"""The Jupyter kernel client `lab run` executes notebooks with: reads in short polls, so no reply is missed.

nbclient waits for a cell's `execute_reply` with one `get_msg(timeout=cell timeout)` on the shell channel and
for its outputs with `get_msg(timeout=None)` on IOPub. ZeroMQ's socket descriptor is edge-triggered: when the
wake-up for a message that has already arrived is missed, that single wait sleeps until its timeout although
the message sits in the socket (jupyter/nbclient#312, open; nbclient PR #311 proposes polling). Here it hung
the widget cells of notebooks 02, 03 and 08 in `make test` with the kernel idle, for the whole cell timeout
(300 s a cell), and a `lab run` without a timeout would hang for good.

`PollingChannel.get_msg` keeps the caller's timeout but waits in slices of `POLL_S`; every new poll checks the
socket before it waits (pyzmq's asyncio poller), so a missed wake-up costs at most one slice.
`PollingKernelManager` hands nbclient a client whose shell and IOPub channels poll this way; `run_notebook`
passes it as nbclient's `kernel_manager_class`.
"""

from __future__ import annotations

import time
from queue import Empty

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

POLL_S = 0.5


class PollingChannel(AsyncZMQSocketChannel):
    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            try:
                return await super().get_msg(timeout=step)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class PollingKernelClient(AsyncKernelClient):
    shell_channel_class = Type(PollingChannel)
    iopub_channel_class = Type(PollingChannel)


class PollingKernelManager(AsyncKernelManager):
    # AsyncKernelManager builds its clients from `client_factory`; `client_class` names the same class for
    # anything that reads it.
    client_class = DottedObjectName("lab.workflow.kernel_client.PollingKernelClient")
    client_factory = Type(PollingKernelClient)
