"""What ``/health`` says of a Ray Serve cluster's Synth replicas: how many run, read from Ray Serve's controller
(``serve.status()``), and the 503 of a cluster with none (all lost, or not started yet: Ray is replacing them)."""

from __future__ import annotations

import asyncio

from ray import serve

from .errors import ApiError

STATUS_TIMEOUT_S = 2.0  # a probe's answer comes at once, even when the controller is slow


def running_replicas(app: str, deployment: str) -> int:
    """The replicas of ``deployment`` in the Serve application ``app`` that Ray reports running (0 when Ray knows
    neither)."""
    status = serve.status().applications.get(app)
    overview = None if status is None else status.deployments.get(deployment)
    return 0 if overview is None else overview.replica_states.get("RUNNING", 0)


async def replicas_or_503(app: str, deployment: str) -> int:
    """:func:`running_replicas`, asked in a thread for at most STATUS_TIMEOUT_S; raises the 503 ``no_replica``
    (Retry-After) when none runs or Ray's controller does not answer: a load balancer then sends elsewhere."""
    try:
        running = await asyncio.wait_for(asyncio.to_thread(running_replicas, app, deployment), STATUS_TIMEOUT_S)
    except TimeoutError:
        running = None
    if not running:
        said = "no replica is running" if running == 0 else "Ray's controller did not answer"
        raise ApiError(
            503,
            f"the cluster cannot speak now: {said} (Ray starts or replaces them); retry after Retry-After seconds",
            code="no_replica",
            headers={"Retry-After": "5"},
        )
    return running
