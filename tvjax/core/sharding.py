"""Many devices: the trajectory axis of every estimator's chunk shards across a device mesh.

Estimators call `shard_rows` on each chunk of trajectories they sample. Outside a mesh it does
nothing; inside `with jax.set_mesh(trajectory_mesh()):` it constrains the chunk's leading
(trajectory) axis to the mesh axis `TRAJECTORIES`, and XLA partitions the sampling, the oracle
draws and the per-chunk reductions across devices. Under a mesh the estimators draw with JAX's
partitionable threefry: random numbers depend on the key and the element index only, so a run on
any number of mesh devices draws the same numbers for the same key; only the order of the final
float sums differs. Without a mesh they use the classic threefry, faster on CPU (see
`random_streams`).

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


def mesh_active():
    """Whether the current mesh has the trajectory axis (estimators then shard their chunks)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and TRAJECTORIES in mesh.axis_names


def random_streams():
    """The threefry variant for tracing an estimator: partitionable under a trajectory mesh (each
    device draws its own rows, and any number of mesh devices draws the same numbers for a key),
    the classic one otherwise: on XLA's CPU it draws the estimators' chunks about 2x faster. The
    two give different numbers for one key, so compare a sharded run with a one-device mesh."""
    return jax.threefry_partitionable(mesh_active())


def shard_rows(x):
    """Constrain x's leading axis to the current mesh's trajectory axis (no-op without one)."""
    if not mesh_active():
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(TRAJECTORIES))
