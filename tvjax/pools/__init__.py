"""Score pools, the on-disk currency: `store` writes and loads them (zarr, no JAX: the engine
bridges use it), `synthetic` writes one from core processes, `analysis` holds the appendix-B
analyses of a loaded pool and `report` turns them into markdown, JSON and figures.
Each needs the `pools` extra (`pip install 'tvjax[pools]'`)."""
