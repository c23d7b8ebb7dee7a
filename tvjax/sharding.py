"""Many devices: the trajectory axis of every estimator's chunk shards across a device mesh.

Estimators call `shard_rows` on each chunk of trajectories they sample. Outside a mesh it does
nothing; inside `with jax.set_mesh(trajectory_mesh()):` it constrains the chunk's leading
(trajectory) axis to the mesh axis `TRAJECTORIES`, and XLA partitions the sampling, the oracle
draws and the per-chunk reductions across devices. With JAX's partitionable threefry (the
default), random numbers depend on the key and the element index only, so a sharded run draws the
same numbers as a single-device run for the same key; only the order of the final float sums
differs.

Multi-host: call `jax.distributed.initialize()` on every host first; `trajectory_mesh()` then
spans `jax.devices()` of all hosts, and every host runs the same program with the same key.
"""

import jax
from jax.sharding import AxisType, PartitionSpec

TRAJECTORIES = "trajectories"


def trajectory_mesh(devices=None):
    """A one-axis mesh over `devices` (default: every device of every process)."""
    devices = jax.devices() if devices is None else list(devices)
    return jax.make_mesh((len(devices),), (TRAJECTORIES,), axis_types=(AxisType.Auto,), devices=devices)


def shard_rows(x):
    """Constrain x's leading axis to the current mesh's trajectory axis (no-op without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or TRAJECTORIES not in mesh.axis_names:
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(TRAJECTORIES))
