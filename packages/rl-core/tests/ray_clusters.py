"""A simulated GPU cluster for tests: real Ray nodes with logical GPUs (``ray.cluster_utils``)."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.cluster_utils import Cluster

from genrm_serve.testing import free_port

#: Per-node defaults: a node of 8 logical GPUs. Logical CPUs are a scheduling token, not cores.
NODE: dict[str, Any] = {"num_cpus": 8, "num_gpus": 8}


@contextmanager
def logical_gpu_cluster(*, dashboard: bool = False, **node: Any) -> Iterator[Cluster]:
    """A one-node cluster (add nodes with ``cluster.add_node(**NODE)``), connected; torn down after.

    ``dashboard``: Ray's state API answers through it (off by default: it costs memory).
    """
    c = Cluster(
        initialize_head=True,
        head_node_args={
            **(node or NODE),
            "include_dashboard": dashboard,
            # not Ray's default 8265 either: another cluster's dashboard may hold it
            **({"dashboard_port": free_port()} if dashboard else {}),
            # not the agent's default 52365: another cluster on the machine may hold it, and
            # then this one's job and state requests go to (or fail at) that cluster's agent
            "dashboard_agent_listen_port": free_port(),
            # no pool of idle workers started up front: the test machine has 2 real cores
            "_system_config": {
                "prestart_worker_first_driver": False,
                "enable_worker_prestart": False,
            },
        },
    )
    try:
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
